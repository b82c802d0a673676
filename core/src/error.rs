use std::{error::Error, fmt};

use tower::BoxError;

/// An error that retrying will not fix: the controller logs it and does not
/// run the key again until its object changes (or something else asks for
/// it), instead of backing it off and retrying.
///
/// Return it, or any error that has it in its source chain, from a
/// reconciler:
///
/// ```
/// use kube_multicluster::{Action, McRequest, TerminalError};
/// use tower::BoxError;
///
/// async fn reconcile(request: McRequest) -> Result<Action, BoxError> {
///     if request.name.contains('_') {
///         // Retrying will not make the name valid; a rename will run it again.
///         return Err(TerminalError::new(format!("{request}: '_' is not allowed here")).into());
///     }
///     Ok(Action::await_change())
/// }
/// ```
pub struct TerminalError {
    source: BoxError,
}

impl TerminalError {
    /// Marks `error` as terminal.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self {
            source: error.into(),
        }
    }

    /// The error that was marked terminal.
    pub fn into_inner(self) -> BoxError {
        self.source
    }

    /// Whether `error` is terminal: a `TerminalError`, or caused by one.
    pub fn is_in(error: &(dyn Error + 'static)) -> bool {
        causes(error).any(|cause| cause.is::<TerminalError>())
    }
}

impl fmt::Debug for TerminalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TerminalError").field(&self.source).finish()
    }
}

impl fmt::Display for TerminalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl Error for TerminalError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        // The marked error's own causes: its message is this one's.
        self.source.source()
    }
}

/// `error` and its sources, outermost first.
pub(crate) fn causes<'a>(
    error: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&error| error.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reconcile failed")]
    struct Wrapper(#[source] TerminalError);

    #[test]
    fn a_terminal_error_is_found_in_a_source_chain() {
        let plain: BoxError = "try again".into();
        assert!(!TerminalError::is_in(&*plain));
        let terminal: BoxError = TerminalError::new("bad spec").into();
        assert!(TerminalError::is_in(&*terminal));
        assert_eq!(terminal.to_string(), "bad spec");
        let wrapped: BoxError = Wrapper(TerminalError::new("bad spec")).into();
        assert!(TerminalError::is_in(&*wrapped));
    }
}
