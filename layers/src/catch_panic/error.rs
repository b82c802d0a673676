use std::any::Any;

/// A reconcile panicked; the panic's message, if it had one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reconcile panicked: {message}")]
pub struct Panicked {
    message: String,
}

impl Panicked {
    pub(crate) fn from_payload(payload: Box<dyn Any + Send>) -> Self {
        Self {
            message: kube_multicluster::panic_message(payload.as_ref()),
        }
    }

    /// The panic's message.
    pub fn message(&self) -> &str {
        &self.message
    }
}
