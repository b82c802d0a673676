//! What a request's error says: its text, safe to show, and whether the
//! cluster gave no answer at all.

use http::StatusCode;

/// An error and every error beneath it, as one line: `a: b: c`.
///
/// A TLS failure reads as what went wrong (an unknown CA, say), not only as
/// the outermost `client error (Connect)`.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    // A credential plugin's failure quotes its command line, its
    // environment and its output, which may hold secrets; so do the errors
    // that wrap it.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(withheld) = credentials_failed(error) {
            return withheld;
        }
        cause = error.source();
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Many errors repeat their source in their own message.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether `error` itself is a failure to obtain credentials.
pub(crate) fn is_credential_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    error.downcast_ref::<kube::client::AuthError>().is_some()
        || matches!(
            error.downcast_ref::<kube::Error>(),
            Some(kube::Error::Auth(_))
        )
}

/// What to say of `error` if it is a failure to obtain credentials, whose
/// own text is not to be repeated.
fn credentials_failed(error: &(dyn std::error::Error + 'static)) -> Option<String> {
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
/// answer: the connection failed, was refused, closed or timed out, or a
/// gateway answered `502`-`504` for it. An answer of the server's own (a
/// `4xx`, a `500`), a credential that could not be obtained, or the
/// reconciler's own error is not.
pub(crate) fn is_unanswered(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if is_credential_failure(error) {
            return false;
        }
        match error.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => return matches!(status.code, 502..=504),
            Some(
                kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_),
            ) => {
                // A service error may wrap a credential failure: look
                // beneath it first.
                let mut below = error.source();
                while let Some(cause) = below {
                    if is_credential_failure(cause) {
                        return false;
                    }
                    below = cause.source();
                }
                return true;
            }
            _ => {}
        }
        next = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::error_chain;

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
}
