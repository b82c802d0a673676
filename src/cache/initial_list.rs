//! How a watch lists what is there before it watches: by a streaming list
//! where the API server allows it, in pages where it does not.
//!
//! A streaming list (`sendInitialEvents=true`) has the API server send the
//! objects from its watch cache as events on the watch itself: nothing is
//! read from etcd, no page of objects is held on either side, and one request
//! does what a paged list and a watch do in two or more. API servers whose
//! `WatchList` feature is off refuse it with `422 Invalid`, as do API servers
//! before 1.27, which know no streaming lists, and kube's watcher would then
//! retry the same request for ever. Here the first refusal
//! switches the watch to paged lists, and the cluster remembers it so that
//! its later watches page from the start.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::runtime::watcher::{self, Event, InitialListStrategy};

use crate::ClusterName;

/// One cluster's experience of streaming lists: whether its API server has
/// refused one.
#[derive(Debug, Default)]
pub(crate) struct ListMode {
    refused: AtomicBool,
}

impl ListMode {
    fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

/// The stream of events `events` makes, given a watcher configuration, with
/// the initial list streamed unless `mode` says this cluster refuses it. A
/// refusal switches the stream to paged lists and is remembered in `mode`.
pub(crate) fn streamed_or_paged<T, F>(
    mode: Arc<ListMode>,
    cluster: ClusterName,
    kind: String,
    config: watcher::Config,
    events: F,
) -> BoxStream<'static, watcher::Result<Event<T>>>
where
    T: Send + 'static,
    F: Fn(watcher::Config) -> BoxStream<'static, watcher::Result<Event<T>>> + Send + 'static,
{
    let paged = watcher::Config {
        initial_list_strategy: InitialListStrategy::ListWatch,
        ..config
    };
    // kube asks for a streaming list only with bookmarks, which carry the
    // list's end.
    if mode.refused() || !paged.bookmarks {
        return events(paged);
    }
    let streaming = events(watcher::Config {
        initial_list_strategy: InitialListStrategy::StreamingList,
        ..paged.clone()
    });
    Fallback {
        current: streaming,
        paged: Some(Box::new(move || events(paged))),
        mode,
        cluster,
        kind,
    }
    .boxed()
}

type Later<T> = Box<dyn FnOnce() -> BoxStream<'static, watcher::Result<Event<T>>> + Send>;

/// A streaming watch that turns into a paged one at its first refusal.
struct Fallback<T> {
    current: BoxStream<'static, watcher::Result<Event<T>>>,
    /// The paged watch, until it replaces the streaming one.
    paged: Option<Later<T>>,
    mode: Arc<ListMode>,
    cluster: ClusterName,
    kind: String,
}

impl<T> Stream for Fallback<T> {
    type Item = watcher::Result<Event<T>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let next = ready!(self.current.poll_next_unpin(cx));
            match next {
                Some(Err(error)) if self.paged.is_some() && refuses_streaming(&error) => {
                    if !self.mode.refused.swap(true, Ordering::Relaxed) {
                        tracing::info!(
                            cluster = %self.cluster,
                            kind = %self.kind,
                            "the API server refuses streaming lists (its WatchList feature is off); listing in pages"
                        );
                    }
                    let paged = self.paged.take().expect("checked above");
                    self.current = paged();
                }
                next => return Poll::Ready(next),
            }
        }
    }
}

/// Whether `error` is an API server's refusal of a streaming list: of
/// `sendInitialEvents` where the `WatchList` feature is off, or of the
/// `resourceVersionMatch` that goes with it on a watch, by API servers
/// before 1.27.
fn refuses_streaming(error: &watcher::Error) -> bool {
    const PARAMETERS: [&str; 2] = ["sendInitialEvents", "resourceVersionMatch"];
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
            let causes = status.details.iter().flat_map(|details| &details.causes);
            matches!(status.code, 400 | 422)
                && (PARAMETERS.iter().any(|p| status.message.contains(p))
                    || causes.into_iter().any(|c| PARAMETERS.contains(&&*c.field)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kube::core::{
        Status,
        response::{StatusCause, StatusDetails},
    };

    use super::*;

    fn refusal() -> watcher::Error {
        let status = Status::failure(
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: \
             sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "Invalid",
        )
        .with_code(422);
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    }

    fn forbidden() -> watcher::Error {
        let status = Status::failure("configmaps is forbidden", "Forbidden").with_code(403);
        watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()))
    }

    /// A source that records the strategy of each watch it is asked for and
    /// answers a streaming one with `streaming`, a paged one with `InitDone`.
    fn source(
        asked: Arc<Mutex<Vec<InitialListStrategy>>>,
        streaming: fn() -> watcher::Error,
    ) -> impl Fn(watcher::Config) -> BoxStream<'static, watcher::Result<Event<()>>> + Send + 'static
    {
        move |config| {
            asked
                .lock()
                .unwrap()
                .push(config.initial_list_strategy.clone());
            match config.initial_list_strategy {
                InitialListStrategy::StreamingList => {
                    futures::stream::iter([Err(streaming())]).boxed()
                }
                InitialListStrategy::ListWatch => {
                    futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)]).boxed()
                }
            }
        }
    }

    #[tokio::test]
    async fn a_refused_streaming_list_turns_into_paged_lists_for_the_cluster() {
        let mode = Arc::new(ListMode::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let events = streamed_or_paged(
            mode.clone(),
            "a".into(),
            "ConfigMap".into(),
            watcher::Config::default(),
            source(asked.clone(), refusal),
        );
        let events: Vec<_> = events.collect().await;
        assert!(
            matches!(events[..], [Ok(Event::Init), Ok(Event::InitDone)]),
            "the refusal is not passed on: {events:?}"
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [
                InitialListStrategy::StreamingList,
                InitialListStrategy::ListWatch
            ]
        );
        assert!(mode.refused());
        // The cluster's next watch pages from the start.
        asked.lock().unwrap().clear();
        let _ = streamed_or_paged(
            mode,
            "a".into(),
            "Secret".into(),
            watcher::Config::default(),
            source(asked.clone(), refusal),
        );
        assert_eq!(*asked.lock().unwrap(), [InitialListStrategy::ListWatch]);
    }

    #[tokio::test]
    async fn a_watch_without_bookmarks_pages() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let _ = streamed_or_paged(
            Arc::default(),
            "a".into(),
            "ConfigMap".into(),
            watcher::Config::default().disable_bookmarks(),
            source(asked.clone(), refusal),
        );
        assert_eq!(*asked.lock().unwrap(), [InitialListStrategy::ListWatch]);
    }

    #[tokio::test]
    async fn other_errors_are_passed_on_and_change_nothing() {
        let mode = Arc::new(ListMode::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let events = streamed_or_paged(
            mode.clone(),
            "a".into(),
            "ConfigMap".into(),
            watcher::Config::default(),
            source(asked.clone(), forbidden),
        );
        let events: Vec<_> = events.collect().await;
        assert!(matches!(
            events[..],
            [Err(watcher::Error::WatchStartFailed(_))]
        ));
        assert_eq!(*asked.lock().unwrap(), [InitialListStrategy::StreamingList]);
        assert!(!mode.refused());
    }

    #[test]
    fn an_error_response_naming_the_parameter_only_in_its_causes_is_a_refusal() {
        let status = Status::failure("ListOptions is invalid", "Invalid")
            .with_code(422)
            .with_details(StatusDetails {
                name: String::new(),
                group: "meta.k8s.io".into(),
                kind: "ListOptions".into(),
                uid: String::new(),
                causes: vec![StatusCause {
                    reason: "FieldValueForbidden".into(),
                    message: "Forbidden".into(),
                    field: "sendInitialEvents".into(),
                }],
                retry_after_seconds: 0,
            });
        let error = watcher::Error::WatchStartFailed(kube::Error::Api(status.boxed()));
        assert!(refuses_streaming(&error));
        assert!(!refuses_streaming(&forbidden()));
        // How API servers before 1.27 answer.
        let old = Status::failure(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden for watch",
            "Invalid",
        )
        .with_code(422);
        let error = watcher::Error::WatchStartFailed(kube::Error::Api(old.boxed()));
        assert!(refuses_streaming(&error));
    }
}
