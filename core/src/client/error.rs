//! What a request's error says: its text, safe to show, and whether the
//! cluster gave no answer at all.

use http::StatusCode;

use super::exec::PluginError;
use crate::{cluster_name::ClusterName, error::causes};

/// An error and every error beneath it, as one line (`a: b: c`), for
/// problems and logs: the one way the crate tells an error.
///
/// A TLS failure reads as what went wrong (an unknown CA, say), not only as
/// the outermost `client error (Connect)`. A failure to obtain credentials
/// is told as that alone: kube's text of it quotes a credential plugin's
/// command line, environment and output, which may hold secrets.
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// #[error("reconcile failed")]
/// struct Outer(#[source] std::io::Error);
///
/// let error = Outer(std::io::Error::other("connection refused"));
/// assert_eq!(kube_multicluster::client::error_chain(&error), "reconcile failed: connection refused");
/// ```
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    // A credential plugin's failure quotes its command line, its
    // environment and its output, which may hold secrets; so do the errors
    // that wrap it.
    if let Some(withheld) = causes(error).find_map(credentials_failed) {
        return withheld;
    }
    let mut text = error.to_string();
    for cause in causes(error).skip(1) {
        let cause_text = cause.to_string();
        // Many errors repeat their source in their own message.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
    }
    text
}

/// Whether `error` itself is a failure to obtain credentials.
pub(crate) fn is_credential_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<PluginError>()
        || error.downcast_ref::<kube::client::AuthError>().is_some()
        || matches!(
            error.downcast_ref::<kube::Error>(),
            Some(kube::Error::Auth(_))
        )
}

/// Whether `error`, or an error beneath it, is a failure to obtain
/// credentials: no request was made.
pub(crate) fn credentials_unavailable(error: &(dyn std::error::Error + 'static)) -> bool {
    causes(error).any(is_credential_failure)
}

/// What to say of `error` if it is a failure to obtain credentials, whose
/// own text is not to be repeated: kube's quotes a plugin's command line,
/// environment and output. This crate's own plugin errors say what
/// happened without them.
fn credentials_failed(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(plugin) = error.downcast_ref::<PluginError>() {
        return Some(format!(
            "the cluster's credentials could not be obtained: {plugin}"
        ));
    }
    is_credential_failure(error).then(|| {
        "the cluster's credentials could not be obtained (a credential plugin failed, or a \
         token or certificate file could not be read; details withheld, as they may hold secrets)"
            .to_owned()
    })
}

/// Whether `status` is a gateway's: the server behind it gave no answer.
pub(crate) fn is_gateway_failure(status: StatusCode) -> bool {
    matches!(status.as_u16(), 502..=504)
}

/// Whether `error`, or an error beneath it, says that a cluster gave no
/// answer: the connection failed, was refused, reset or closed, or timed
/// out, or a gateway answered `502`-`504` for it. An answer of the
/// server's own (a `4xx`, a `500`), a credential that could not be
/// obtained, a TLS handshake the client or the server refused (a
/// certificate that does not verify: the cluster answered, and its
/// configuration is wrong), or the reconciler's own error is not.
pub(crate) fn is_unanswered(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut unanswered = false;
    for error in causes(error) {
        if is_credential_failure(error)
            || is_tls_failure(error)
            || error.is::<OwnerReferenceAcross>()
        {
            return false;
        }
        match error.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) if !unanswered => {
                return matches!(status.code, 502..=504);
            }
            // What failed beneath may still be a credential or TLS failure.
            Some(
                kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_),
            ) => unanswered = true,
            _ => {}
        }
    }
    unanswered
}

/// Whether `error` is a TLS failure: rustls's own, or an I/O error that
/// carries one (as a connector reports it; an I/O error's `source` skips
/// the error it carries).
fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "rustls-tls")]
    {
        let carried = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .is_some_and(|inner| inner.is::<rustls::Error>());
        carried || error.is::<rustls::Error>()
    }
    #[cfg(not(feature = "rustls-tls"))]
    {
        let _ = error;
        false
    }
}

/// A write refused before it was sent: the object names as its owner, in
/// `metadata.ownerReferences`, the object being reconciled in another
/// cluster, where the owner does not exist: on another API server, or, on
/// the same one (namespaces of one host engaged as clusters), a namespaced
/// owner in another namespace than the object.
///
/// The cluster's garbage collector would take the owner for deleted and
/// delete the object soon after it was made, and the next reconcile make
/// it again, without end. A child in another cluster than its parent is marked with
/// [`ParentRef::adopt`](crate::ownership::ParentRef::adopt) instead, and
/// its parent reconciled when it changes or goes with
/// [`Controller::owns_across`](crate::Controller::owns_across); see
/// [`ownership`](crate::ownership).
///
/// An engaged cluster's client refuses it while the owner's reconcile runs
/// (also when a layer or [`apply`](crate::apply::apply) makes the write),
/// but not from a task the reconcile spawned, nor through a client the
/// reconciler built itself. It reaches the reconciler as
/// `kube::Error::Service` holding this error:
///
/// ```
/// use kube_multicluster::ownership::OwnerReferenceAcross;
///
/// fn refused(error: &kube::Error) -> Option<&OwnerReferenceAcross> {
///     match error {
///         kube::Error::Service(inner) => inner.downcast_ref(),
///         _ => None,
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused to write {path} to cluster {cluster}: its ownerReferences name {owner} (uid {uid}) \
     of cluster {owner_cluster}, which the garbage collector where the object is written cannot \
     find (another API server, or another namespace): it would take the owner for deleted and \
     delete the object, and the reconcile make it again, without end. Mark the child with \
     ParentRef::adopt and watch it with Controller::owns_across instead"
)]
#[non_exhaustive]
pub struct OwnerReferenceAcross {
    /// The cluster the write was for.
    pub cluster: ClusterName,
    /// The path of the object written: the request's, or for a create,
    /// its collection's with the name from the body put after it
    /// (`/api/v1/namespaces/default/configmaps/child`), or, where the body
    /// has only a `generateName`, that prefix followed by `*`
    /// (`.../configmaps/child-*`).
    pub path: String,
    /// The cluster of the owner.
    pub owner_cluster: ClusterName,
    /// The owner, as `namespace/name` (or `name`), in `owner_cluster`.
    pub owner: String,
    /// The owner's UID.
    pub uid: String,
}

#[cfg(test)]
mod tests {
    use super::{error_chain, is_unanswered};

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("invalid peer certificate: UnknownIssuer")]
    struct Inner;

    #[test]
    fn an_error_chain_names_the_root_cause() {
        assert_eq!(
            error_chain(&Outer(Inner)),
            "client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed())
    }

    fn connection(inner: std::io::Error) -> kube::Error {
        kube::Error::Service(Box::new(Outer2(inner)))
    }

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer2(#[source] std::io::Error);

    #[test]
    fn only_errors_that_got_no_answer_count_as_unanswered() {
        use std::io::{Error, ErrorKind};

        for unanswered in [
            status(502),
            status(503),
            status(504),
            connection(Error::from(ErrorKind::ConnectionRefused)),
            connection(Error::from(ErrorKind::TimedOut)),
        ] {
            assert!(is_unanswered(&unanswered), "{unanswered}");
            // Wrapped in a reconciler's error, too.
            let boxed: tower::BoxError = unanswered.into();
            assert!(is_unanswered(&*boxed), "{boxed}");
        }
        let tls = Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        for answered in [
            status(404),
            status(409),
            status(500),
            connection(tls),
            kube::Error::Auth(kube::client::AuthError::ExecPluginFailed),
        ] {
            assert!(!is_unanswered(&answered), "{answered}");
        }
        assert!(!is_unanswered(&Outer(Inner)), "not a client's error");
    }
}
