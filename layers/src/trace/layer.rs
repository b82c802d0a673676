use std::sync::Arc;

use tower_layer::Layer;

use super::Trace;

/// Wraps a service in [`Trace`].
#[derive(Debug, Clone, Default)]
pub struct TraceLayer {
    controller: Option<Arc<str>>,
}

impl TraceLayer {
    /// A span per reconcile, naming the controller the request names (an
    /// `ObjectRequest` from `Controller::run` does).
    pub const fn new() -> Self {
        Self { controller: None }
    }

    /// Names the controller in every span, whatever the request says: for
    /// requests that name none (plain `McRequest`s).
    #[must_use]
    pub fn controller(mut self, name: impl Into<Arc<str>>) -> Self {
        self.controller = Some(name.into());
        self
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace::new(inner, self.controller.clone())
    }
}
