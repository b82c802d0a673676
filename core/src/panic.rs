//! Panics contained where one task's must not end others: user code (a
//! reconciler's `poll_ready` and `call`, an error policy, a mapper, a
//! filter, a transform) runs through [`contain`], and a panic caught from a
//! task or a future is told by its [`panic_message`]; a lock a panic
//! poisoned is taken as it is ([`lock`]).

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Mutex, MutexGuard, PoisonError},
};

/// Runs `f` so that a panic in it ends only `f`: its result, or the panic's
/// message. A payload whose drop panics in turn is contained too.
pub(crate) fn contain<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = panic_message(payload.as_ref());
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        message
    })
}

/// Locks `mutex`, also one a panic poisoned: the crate changes what its
/// locks guard in steps that leave it whole, and a panic ends one task only.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The message a panic was raised with: its `&str` or `String` payload, or
/// `(no message)` for any other. For a panic caught with
/// [`std::panic::catch_unwind`] or from a task's
/// [`JoinError::into_panic`](tokio::task::JoinError::into_panic).
///
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("boom {}", 1)).unwrap_err();
/// assert_eq!(kube_multicluster::panic_message(payload.as_ref()), "boom 1");
/// ```
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(no message)".to_owned()
    }
}
