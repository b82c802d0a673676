//! The tracing layer, alone, with a subscriber that records spans.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube_multicluster::{Action, McRequest};
use kube_multicluster_layers::trace::TraceLayer;
use tower::{BoxError, ServiceBuilder, ServiceExt, service_fn};
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, layer::Context, prelude::*, registry::LookupSpan};

/// A closed span: its name and fields.
type Closed = (String, HashMap<String, String>);

/// Every closed span.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Closed>>>);

struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields(HashMap::new());
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        values.record(extensions.get_mut::<Fields>().unwrap());
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions_mut().remove::<Fields>().unwrap().0;
        self.0
            .lock()
            .unwrap()
            .push((span.name().to_owned(), fields));
    }
}

#[tokio::test]
async fn each_reconcile_gets_a_span_with_its_request_outcome_and_duration() {
    let recorder = Recorder::default();
    let _guard = tracing_subscriber::registry()
        .with(recorder.clone())
        .set_default();

    let service = ServiceBuilder::new()
        .layer(TraceLayer::new().controller("widgets"))
        .service(service_fn(|request: McRequest| async move {
            // The reconciler runs inside its span.
            assert_eq!(
                tracing::Span::current().metadata().map(|m| m.name()),
                Some("reconcile")
            );
            if request.name == "broken" {
                return Err::<Action, BoxError>("nope".into());
            }
            Ok(Action::await_change())
        }));
    service
        .clone()
        .oneshot(McRequest::new("east", Some("prod"), "fine"))
        .await
        .unwrap();
    service
        .oneshot(McRequest::new("west", None::<String>, "broken"))
        .await
        .unwrap_err();

    let spans = recorder.0.lock().unwrap().clone();
    assert_eq!(spans.len(), 2);
    let (name, fine) = &spans[0];
    assert_eq!(name, "reconcile");
    assert_eq!(fine["controller"], "widgets");
    assert_eq!(fine["cluster"], "east");
    assert_eq!(fine["namespace"], "prod");
    assert_eq!(fine["name"], "fine");
    assert_eq!(fine["outcome"], "ok");
    assert!(fine.contains_key("duration_ms"));
    let (_, broken) = &spans[1];
    assert_eq!(broken["cluster"], "west");
    assert_eq!(broken["namespace"], "");
    assert_eq!(broken["outcome"], "error");
}
