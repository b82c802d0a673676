//! How a watch lists what is there before it watches: by a streaming list
//! where the watch asks for one and the API server allows it, in pages
//! otherwise.
//!
//! A streaming list (`sendInitialEvents=true`) has the API server send the
//! objects from its watch cache as events on the watch itself: nothing is
//! read from etcd, no page of objects is held on either side, and one request
//! does what a paged list and a watch do in two or more. kube's watcher asks
//! for it at resource version `0`, which the API server may answer from a
//! cache older than what the client has seen, where a paged list of
//! `ListSemantic::MostRecent` (kube's default) is a consistent read. So a
//! watch streams only when its configuration accepts that: it names
//! `InitialListStrategy::StreamingList` (`streaming_lists()`) or
//! `ListSemantic::Any` (`any_semantic()`).
//!
//! API servers whose `WatchList` feature is off refuse a streaming list with
//! `422 Invalid`, as do API servers before 1.27, and kube's watcher would
//! then retry the same request for ever. Here the first refusal switches the
//! watch to paged lists, and the cluster remembers it so that its later
//! watches page from the start. A streaming list that ends before it is
//! complete (its watch timed out or was cut: a large list over a slow link)
//! would start again from nothing each time; the watch switches to paged
//! lists then too, which resume page by page.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};

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

/// Whether a watch with `config` lists by streaming where it can.
pub(crate) fn wants_streaming(config: &watcher::Config) -> bool {
    // kube asks for a streaming list only with bookmarks, which carry the
    // list's end.
    config.bookmarks
        && (config.initial_list_strategy == InitialListStrategy::StreamingList
            || config.list_semantic == ListSemantic::Any)
}

/// The stream of events `events` makes, given a watcher configuration: with
/// the initial list streamed if the configuration accepts it and `mode` does
/// not say this cluster refuses it, in pages otherwise. A refusal, or a
/// streaming list that ends unfinished, switches the stream to paged lists; a
/// refusal is remembered in `mode`.
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
    let streaming = wants_streaming(&config);
    let paged = watcher::Config {
        initial_list_strategy: InitialListStrategy::ListWatch,
        ..config
    };
    if !streaming || mode.refused() {
        return events(paged);
    }
    let streaming = events(watcher::Config {
        initial_list_strategy: InitialListStrategy::StreamingList,
        ..paged.clone()
    });
    Fallback {
        current: streaming,
        paged: Some(Box::new(move || events(paged))),
        listing: false,
        mode,
        cluster,
        kind,
    }
    .boxed()
}

type Later<T> = Box<dyn FnOnce() -> BoxStream<'static, watcher::Result<Event<T>>> + Send>;

/// A streaming watch that turns into a paged one at its first refusal, or
/// when a streaming list starts again before it finished.
struct Fallback<T> {
    current: BoxStream<'static, watcher::Result<Event<T>>>,
    /// The paged watch, until it replaces the streaming one.
    paged: Option<Later<T>>,
    /// Whether a streaming list has begun and not finished.
    listing: bool,
    mode: Arc<ListMode>,
    cluster: ClusterName,
    kind: String,
}

impl<T> Fallback<T> {
    fn page(&mut self, why: &str) {
        if let Some(paged) = self.paged.take() {
            tracing::info!(cluster = %self.cluster, kind = %self.kind, "{why}; listing in pages");
            self.current = paged();
        }
    }
}

impl<T> Stream for Fallback<T> {
    type Item = watcher::Result<Event<T>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let next = ready!(self.current.poll_next_unpin(cx));
            if self.paged.is_none() {
                return Poll::Ready(next);
            }
            match &next {
                Some(Err(error)) if refuses_streaming(error) => {
                    let first = !self.mode.refused.swap(true, Ordering::Relaxed);
                    let why = if first {
                        "the API server refuses streaming lists (its WatchList feature is off)"
                    } else {
                        "the API server refused a streaming list"
                    };
                    self.page(why);
                    continue;
                }
                // The stream ended before the list did, and starts again
                // from nothing: it may never get to the end.
                Some(Ok(Event::Init)) if self.listing => {
                    self.page("a streaming list ended before it was complete");
                    continue;
                }
                Some(Ok(Event::Init)) => self.listing = true,
                Some(Ok(Event::InitDone)) => self.listing = false,
                _ => {}
            }
            return Poll::Ready(next);
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
            watcher::Config::default().streaming_lists(),
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
            watcher::Config::default().streaming_lists(),
            source(asked.clone(), refusal),
        );
        assert_eq!(*asked.lock().unwrap(), [InitialListStrategy::ListWatch]);
    }

    #[test]
    fn only_a_watch_that_accepts_a_list_from_the_cache_streams() {
        let default = watcher::Config::default();
        assert!(!wants_streaming(&default), "a consistent list, in pages");
        assert!(wants_streaming(&default.clone().streaming_lists()));
        assert!(wants_streaming(&default.clone().any_semantic()));
        assert!(!wants_streaming(
            &default.any_semantic().disable_bookmarks()
        ));
    }

    #[tokio::test]
    async fn a_streaming_list_that_starts_again_unfinished_turns_into_paged_lists() {
        let mode = Arc::new(ListMode::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let events = streamed_or_paged(
            mode.clone(),
            "a".into(),
            "ConfigMap".into(),
            watcher::Config::default().any_semantic(),
            {
                let asked = asked.clone();
                move |config: watcher::Config| {
                    asked
                        .lock()
                        .unwrap()
                        .push(config.initial_list_strategy.clone());
                    let events: Vec<watcher::Result<Event<()>>> = match config.initial_list_strategy
                    {
                        // Timed out half-way, and starting over.
                        InitialListStrategy::StreamingList => {
                            vec![Ok(Event::Init), Ok(Event::InitApply(())), Ok(Event::Init)]
                        }
                        InitialListStrategy::ListWatch => {
                            vec![
                                Ok(Event::Init),
                                Ok(Event::InitApply(())),
                                Ok(Event::InitDone),
                            ]
                        }
                    };
                    futures::stream::iter(events).boxed()
                }
            },
        );
        let events: Vec<_> = events.collect().await;
        assert!(
            matches!(
                events[..],
                [
                    Ok(Event::Init),
                    Ok(Event::InitApply(())),
                    Ok(Event::Init),
                    Ok(Event::InitApply(())),
                    Ok(Event::InitDone)
                ]
            ),
            "the paged list starts afresh and completes: {events:?}"
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [
                InitialListStrategy::StreamingList,
                InitialListStrategy::ListWatch
            ]
        );
        assert!(!mode.refused(), "the cluster's other watches still stream");
    }

    #[tokio::test]
    async fn a_watch_without_bookmarks_pages() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let _ = streamed_or_paged(
            Arc::default(),
            "a".into(),
            "ConfigMap".into(),
            watcher::Config::default()
                .streaming_lists()
                .disable_bookmarks(),
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
            watcher::Config::default().streaming_lists(),
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
