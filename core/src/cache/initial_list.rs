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
//! complete starts again from nothing, so one too large to be sent within its
//! watch's timeout (a large list over a slow link) would never complete: a
//! streaming list that ran until its watch timed out, or two in a row cut
//! short, switch the watch to consistent paged lists for the rest of its
//! life, each page a request of its own, served from etcd (pages from the
//! API server's cache can come in one piece).

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use tokio::time::Instant;

use crate::cluster_name::ClusterName;

/// One cluster's experience of streaming lists: whether its API server has
/// refused one.
#[derive(Debug, Default)]
pub(crate) struct ListMode {
    refused: AtomicBool,
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
    if !streaming || mode.refused.load(Ordering::Relaxed) {
        return events(paged);
    }
    let timeout = Duration::from_secs(paged.timeout.unwrap_or(DEFAULT_TIMEOUT).into());
    let streaming = events(watcher::Config {
        initial_list_strategy: InitialListStrategy::StreamingList,
        ..paged.clone()
    });
    Fallback {
        current: streaming,
        paged: Some((Box::new(events), paged)),
        listing: None,
        unfinished: 0,
        timeout,
        mode,
        cluster,
        kind,
    }
    .boxed()
}

/// The server-side timeout of kube's watches when the configuration gives
/// none, in seconds.
const DEFAULT_TIMEOUT: u32 = 290;

type Events<T> =
    Box<dyn Fn(watcher::Config) -> BoxStream<'static, watcher::Result<Event<T>>> + Send>;

/// A streaming watch that turns into a paged one at its first refusal, or
/// when its streaming list keeps ending before it is complete.
struct Fallback<T> {
    current: BoxStream<'static, watcher::Result<Event<T>>>,
    /// What makes the paged watch, and its configuration, until it
    /// replaces the streaming one.
    paged: Option<(Events<T>, watcher::Config)>,
    /// When the streaming list under way began.
    listing: Option<Instant>,
    /// How many streaming lists in a row ended before they were complete.
    unfinished: u32,
    /// The watch's server-side timeout.
    timeout: Duration,
    mode: Arc<ListMode>,
    cluster: ClusterName,
    kind: String,
}

impl<T> Fallback<T> {
    /// Replaces the streaming watch by a paged one; with consistent pages
    /// if `consistent`.
    fn page(&mut self, why: &str, consistent: bool) {
        if let Some((events, mut config)) = self.paged.take() {
            tracing::info!(cluster = %self.cluster, kind = %self.kind, "{why}; listing in pages");
            if consistent {
                config.list_semantic = ListSemantic::MostRecent;
            }
            self.current = events(config);
        }
    }

    /// Whether a streaming list that began at `began` and ended before it
    /// was complete means the list cannot be streamed: it ran until its
    /// watch timed out, or it is the second in a row to end unfinished. One
    /// cut short (an API server restart, a lost connection) is retried.
    fn gives_up(&mut self, began: Instant) -> bool {
        self.unfinished += 1;
        self.unfinished >= 2 || began.elapsed() >= self.timeout.mul_f32(0.9)
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
                    self.page(why, false);
                    continue;
                }
                // The stream ended before the list did, and starts again
                // from nothing: it may never get to the end. Pages from the
                // cache would come in one piece, so they come from etcd.
                Some(Ok(Event::Init)) => {
                    if let Some(began) = self.listing
                        && self.gives_up(began)
                    {
                        self.page("a streaming list ended before it was complete", true);
                        continue;
                    }
                    self.listing = Some(Instant::now());
                }
                Some(Ok(Event::InitDone)) => {
                    self.listing = None;
                    self.unfinished = 0;
                }
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
    use std::{sync::Mutex, time::Duration};

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

    /// Every event of a watch of cluster "a" with `config`, from `events`.
    async fn listed(
        mode: Arc<ListMode>,
        config: watcher::Config,
        events: impl Fn(watcher::Config) -> BoxStream<'static, watcher::Result<Event<()>>>
        + Send
        + 'static,
    ) -> Vec<watcher::Result<Event<()>>> {
        streamed_or_paged(mode, "a".into(), "ConfigMap".into(), config, events)
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_refused_streaming_list_turns_into_paged_lists_for_the_cluster() {
        let mode = Arc::new(ListMode::default());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let config = watcher::Config::default().streaming_lists();
        let events = listed(mode.clone(), config, source(asked.clone(), refusal)).await;
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
        assert!(mode.refused.load(Ordering::Relaxed));
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

    type Asked = Arc<Mutex<Vec<(InitialListStrategy, ListSemantic)>>>;

    /// A source whose streaming watch yields `streaming` (with a pause of
    /// `pause` before each `Init` but the first) and whose paged watch lists
    /// one object; it records the configuration of each watch asked for.
    fn scripted(
        asked: Asked,
        streaming: Vec<Event<()>>,
        pause: Duration,
    ) -> impl Fn(watcher::Config) -> BoxStream<'static, watcher::Result<Event<()>>> + Send + 'static
    {
        move |config: watcher::Config| {
            asked.lock().unwrap().push((
                config.initial_list_strategy.clone(),
                config.list_semantic.clone(),
            ));
            match config.initial_list_strategy {
                InitialListStrategy::StreamingList => {
                    let events = streaming.clone().into_iter().enumerate();
                    futures::stream::iter(events)
                        .then(move |(i, event)| async move {
                            if i > 0 && matches!(event, Event::Init) {
                                tokio::time::sleep(pause).await;
                            }
                            Ok(event)
                        })
                        .boxed()
                }
                InitialListStrategy::ListWatch => {
                    let events = [Event::Init, Event::InitApply(()), Event::InitDone];
                    futures::stream::iter(events.map(Ok)).boxed()
                }
            }
        }
    }

    fn kinds(events: &[watcher::Result<Event<()>>]) -> Vec<&'static str> {
        events
            .iter()
            .map(|event| match event {
                Ok(Event::Init) => "init",
                Ok(Event::InitApply(())) => "object",
                Ok(Event::InitDone) => "done",
                Ok(Event::Apply(())) => "apply",
                Ok(Event::Delete(())) => "delete",
                Err(_) => "error",
            })
            .collect()
    }

    async fn run(streaming: Vec<Event<()>>, pause: Duration) -> (Vec<&'static str>, Asked) {
        let asked = Asked::default();
        let config = watcher::Config::default().any_semantic().timeout(2);
        let events = listed(
            Arc::default(),
            config,
            scripted(asked.clone(), streaming, pause),
        )
        .await;
        (kinds(&events), asked)
    }

    use Event::{Init, InitApply, InitDone};

    #[tokio::test(start_paused = true)]
    async fn a_streaming_list_cut_short_twice_turns_into_consistent_pages() {
        let streaming = vec![Init, InitApply(()), Init, InitApply(()), Init];
        let (events, asked) = run(streaming, Duration::from_millis(100)).await;
        assert_eq!(
            events,
            ["init", "object", "init", "object", "init", "object", "done"],
            "one retry, then the paged list starts afresh and completes"
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [
                (InitialListStrategy::StreamingList, ListSemantic::Any),
                (InitialListStrategy::ListWatch, ListSemantic::MostRecent),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_list_that_ran_until_its_timeout_turns_into_pages_at_once() {
        // The watch times out after 2 s.
        let streaming = vec![Init, InitApply(()), Init];
        let (events, asked) = run(streaming, Duration::from_secs(2)).await;
        assert_eq!(events, ["init", "object", "init", "object", "done"]);
        assert_eq!(asked.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn complete_streaming_lists_and_one_cut_short_go_on_streaming() {
        let streaming = vec![
            Init,
            InitApply(()),
            InitDone,
            // A relist (after 410 Gone) cut short once, then complete.
            Init,
            InitApply(()),
            Init,
            InitApply(()),
            InitDone,
            // Another relist, cut short once: the count started over.
            Init,
            Init,
            InitDone,
        ];
        let (events, asked) = run(streaming.clone(), Duration::from_millis(100)).await;
        assert_eq!(events.len(), streaming.len(), "all passed on: {events:?}");
        assert_eq!(asked.lock().unwrap().len(), 1, "never paged");
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
        let config = watcher::Config::default().streaming_lists();
        let events = listed(mode.clone(), config, source(asked.clone(), forbidden)).await;
        assert!(matches!(
            events[..],
            [Err(watcher::Error::WatchStartFailed(_))]
        ));
        assert_eq!(*asked.lock().unwrap(), [InitialListStrategy::StreamingList]);
        assert!(!mode.refused.load(Ordering::Relaxed));
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
