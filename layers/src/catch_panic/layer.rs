use tower_layer::Layer;

use super::CatchPanic;

/// Wraps a service in [`CatchPanic`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer {
    _private: (),
}

impl CatchPanicLayer {
    /// A layer that turns panics into errors.
    pub const fn new() -> Self {
        Self { _private: () }
    }
}

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CatchPanic::new(inner)
    }
}
