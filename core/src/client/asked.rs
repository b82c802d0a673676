//! The task a request was sent from, told when the cluster answers it: a
//! watch's task learns that its retry got through, which a watch that
//! resumes where it was tells by no event of its own.

use std::{future::Future, sync::Arc};

tokio::task_local! {
    static ASKER: Asker;
}

/// What a task that sends requests does when one of its watches starts.
#[derive(Clone)]
struct Asker(Arc<dyn Fn() + Send + Sync>);

/// Runs `future`, calling `on_watch` each time a watch request it sends is
/// answered with success.
pub(crate) async fn telling<F: Future>(
    on_watch: impl Fn() + Send + Sync + 'static,
    future: F,
) -> F::Output {
    ASKER.scope(Asker(Arc::new(on_watch)), future).await
}

/// A watch request of the current task was answered with success.
pub(crate) fn watch_started() {
    let _ = ASKER.try_with(|asker| (asker.0)());
}

/// Whether `request` asks to watch.
pub(crate) fn is_watch<B>(request: &http::Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_watch_is_told_by_its_query() {
        let request = |uri: &str| http::Request::get(uri).body(()).unwrap();
        assert!(is_watch(&request(
            "/api/v1/configmaps?allowWatchBookmarks=true&watch=true&resourceVersion=5"
        )));
        assert!(is_watch(&request("/api/v1/pods?watch=1")));
        assert!(!is_watch(&request("/api/v1/configmaps?limit=500")));
        assert!(!is_watch(&request("/api/v1/namespaces/watch=true")));
    }

    #[tokio::test]
    async fn only_the_task_that_asked_is_told() {
        let told = Arc::new(AtomicUsize::new(0));
        let counted = told.clone();
        telling(
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
            },
            async {
                watch_started();
                // Another task's answer is not this one's.
                tokio::spawn(async { watch_started() }).await.unwrap();
            },
        )
        .await;
        watch_started();
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }
}
