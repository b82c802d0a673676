use std::any::Any;

/// A reconcile panicked; the panic's message, if it had one.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reconcile panicked: {message}")]
pub struct Panicked {
    message: String,
}

impl Panicked {
    pub(crate) fn from_payload(payload: Box<dyn Any + Send>) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        Self { message }
    }

    /// The panic's message.
    pub fn message(&self) -> &str {
        &self.message
    }
}
