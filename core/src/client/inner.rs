//! What every layer of a cluster's client stack does with the service
//! below it.

/// The service below a layer of the stack, to call from the future the
/// layer returns: the one that was made ready, with a clone left in its
/// place.
pub(super) fn take<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}
