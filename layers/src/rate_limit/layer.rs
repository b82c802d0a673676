use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube_fleet::ClusterName;
use tower_layer::Layer;

use super::{RateLimit, TokenBucket};

/// Wraps a service in [`RateLimit`]; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    buckets: Buckets,
}

/// Where a request's token comes from.
#[derive(Debug, Clone)]
pub(crate) enum Buckets {
    Shared(TokenBucket),
    PerCluster {
        rate: f64,
        burst: u32,
        buckets: Arc<Mutex<HashMap<ClusterName, TokenBucket>>>,
    },
}

impl Buckets {
    pub(crate) fn for_cluster(&self, cluster: &ClusterName) -> TokenBucket {
        match self {
            Self::Shared(bucket) => bucket.clone(),
            Self::PerCluster {
                rate,
                burst,
                buckets,
            } => buckets
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(cluster.clone())
                .or_insert_with(|| TokenBucket::new(*rate, *burst))
                .clone(),
        }
    }
}

impl RateLimitLayer {
    /// One budget for every request: this bucket's, shared with its clones.
    pub fn shared(bucket: TokenBucket) -> Self {
        Self {
            buckets: Buckets::Shared(bucket),
        }
    }

    /// A bucket of `rate` per second and `burst` for each cluster.
    ///
    /// # Panics
    /// If `rate` is not a positive number or `burst` is zero.
    pub fn per_cluster(rate: f64, burst: u32) -> Self {
        // Checks the arguments now rather than at the first request.
        let _ = TokenBucket::new(rate, burst);
        Self {
            buckets: Buckets::PerCluster {
                rate,
                burst,
                buckets: Arc::default(),
            },
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.buckets.clone())
    }
}
