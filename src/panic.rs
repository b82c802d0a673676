//! Panics contained where one task's must not end others: their message.

/// The message a panic was raised with, when it has one.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(no message)".to_owned()
    }
}
