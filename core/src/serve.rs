//! Answering connections on a listener, a bounded number at once: the one
//! accept loop of the manager's endpoints and of the webhook server.

use std::{future::Future, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

/// How long accepting pauses after it failed (a connection reset as it was
/// accepted, or no descriptor or memory for a moment).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Accepts connections on `listener` until `stop` is cancelled, each served
/// by `serve` in a task of its own, at most `max` at once (more wait to be
/// accepted; a `max` of 0 counts as 1). A connection that fails as it is accepted is logged at `WARN`
/// under `what` and the loop goes on: it never ends for want of a
/// descriptor. Once stopped, nothing more is accepted and the listener is
/// closed; the connections still served are handed back, to drain or
/// [shut down](JoinSet::shutdown).
///
/// ```no_run
/// # async fn example(listener: tokio::net::TcpListener) {
/// use tokio::io::AsyncWriteExt;
/// use tokio_util::sync::CancellationToken;
///
/// let stop = CancellationToken::new();
/// let mut open = kube_multicluster::serve(listener, 64, &stop, "the greeting", |mut stream| async move {
///     let _ = stream.write_all(b"hello\n").await;
/// })
/// .await;
/// open.shutdown().await;
/// # }
/// ```
pub async fn serve<F, C>(
    listener: TcpListener,
    max: usize,
    stop: &CancellationToken,
    what: &str,
    mut serve: F,
) -> JoinSet<()>
where
    F: FnMut(TcpStream) -> C,
    C: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        if connections.len() >= max.max(1) {
            // Full: a connection must end before another is accepted.
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = connections.join_next() => continue,
            }
        }
        // A stop comes first: nothing is accepted once it is asked for.
        let stream = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection to {what}");
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_PAUSE) => continue,
                    }
                }
            },
            Some(_) = connections.join_next() => continue,
        };
        connections.spawn(serve(stream));
    }
    drop(listener);
    connections
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn within<T>(what: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), what)
            .await
            .expect("in time")
    }

    #[tokio::test]
    async fn at_most_max_connections_are_served_at_once_and_a_stop_hands_back_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn({
            let stop = stop.clone();
            async move {
                serve(listener, 1, &stop, "the test", move |mut stream| {
                    let tx = tx.clone();
                    async move {
                        tx.send(()).unwrap();
                        // Held open until the client closes it.
                        let _ = stream.read(&mut [0; 1]).await;
                    }
                })
                .await
            }
        });
        let mut first = TcpStream::connect(address).await.unwrap();
        within(served.recv()).await.unwrap();
        let _second = TcpStream::connect(address).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            served.try_recv().is_err(),
            "the second waits while the first is served"
        );
        first.write_all(b"x").await.unwrap();
        drop(first);
        within(served.recv())
            .await
            .expect("served once the first ended");
        stop.cancel();
        let mut open = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("a stop ends the loop")
            .unwrap();
        assert_eq!(open.len(), 1, "the second, still served, is handed back");
        open.shutdown().await;
        assert!(
            TcpStream::connect(address).await.is_err(),
            "the listener is closed"
        );
    }
}
