//! What a conversion handler is asked: objects of a custom resource to be
//! given in another of its versions.

use std::sync::Arc;

use kube_multicluster::Cluster;

/// One conversion request, from the cluster that sent it: objects stored at
/// one version of a custom resource, to be returned at
/// [`desired_api_version`](Self::desired_api_version), in the same order.
///
/// A handler answers with the converted objects (`Vec<serde_json::Value>`,
/// one for each object asked about); an error fails the conversion, and the
/// API server fails the read or write that needed it with the error's
/// message.
#[derive(Debug)]
pub struct ConversionRequest {
    request: kube::core::conversion::ConversionRequest,
    cluster: Cluster,
    webhook: Arc<str>,
}

impl ConversionRequest {
    /// A request as the server makes it: for tests of a handler.
    pub fn new(
        request: kube::core::conversion::ConversionRequest,
        cluster: Cluster,
        webhook: &str,
    ) -> Self {
        Self {
            request,
            cluster,
            webhook: webhook.into(),
        }
    }

    /// The `apiVersion` (`group/version`) every object must be returned at.
    pub fn desired_api_version(&self) -> &str {
        &self.request.desired_api_version
    }

    /// The objects to convert.
    pub fn objects(&self) -> &[serde_json::Value] {
        &self.request.objects
    }

    /// The objects to convert, owned.
    pub fn into_objects(self) -> Vec<serde_json::Value> {
        self.request.objects
    }

    /// The cluster that asked.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The name of the conversion webhook asked: the CRD's name.
    pub fn webhook(&self) -> &str {
        &self.webhook
    }

    /// kube's request, owned.
    pub fn into_inner(self) -> kube::core::conversion::ConversionRequest {
        self.request
    }
}
