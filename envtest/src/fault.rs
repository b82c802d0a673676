//! A TCP proxy on 127.0.0.1 that can hang or cut off the traffic through it.
//!
//! Every [`TestCluster`](crate::TestCluster) is reached through one, and every
//! [`FaultyLink`](crate::FaultyLink) is one more in front of a cluster's, so a
//! fault acts on exactly the clients that use that address.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};

/// What a proxy does with the connections through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Traffic {
    /// Bytes flow both ways.
    Flowing,
    /// Connections are accepted and kept open, but no more bytes move on any
    /// of them until traffic flows again or is cut off.
    Hung,
    /// Every connection is closed, new ones as soon as they are accepted.
    CutOff,
}

/// A proxy from a port of its own on 127.0.0.1 to an upstream address.
///
/// It runs as one task, which owns one task per connection; dropping the proxy
/// aborts them all, closing its listener and every connection.
#[derive(Debug)]
pub(crate) struct FaultProxy {
    addr: SocketAddr,
    traffic: watch::Sender<Traffic>,
    upstream: watch::Sender<SocketAddr>,
    counts: Arc<Counts>,
    task: JoinHandle<()>,
}

/// How many connections a proxy has accepted, and how many of them are open.
#[derive(Debug, Default)]
struct Counts {
    accepted: AtomicUsize,
    open: AtomicUsize,
}

/// Counts one connection as open while it lives.
struct Open(Arc<Counts>);

impl Open {
    fn new(counts: &Arc<Counts>) -> Self {
        counts.accepted.fetch_add(1, Ordering::Relaxed);
        counts.open.fetch_add(1, Ordering::Relaxed);
        Self(counts.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to
    /// `upstream`. Must be called within a Tokio runtime.
    pub(crate) fn bind(upstream: SocketAddr) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let (traffic, _) = watch::channel(Traffic::Flowing);
        let (upstream, _) = watch::channel(upstream);
        let counts = Arc::<Counts>::default();
        let task = tokio::spawn(accept(
            listener,
            upstream.subscribe(),
            traffic.subscribe(),
            counts.clone(),
        ));
        Ok(Self {
            addr,
            traffic,
            upstream,
            counts,
            task,
        })
    }

    /// The address clients connect to.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where connections are forwarded to.
    pub(crate) fn upstream(&self) -> SocketAddr {
        *self.upstream.borrow()
    }

    /// Forwards new connections to `upstream`; open ones stay where they are.
    pub(crate) fn set_upstream(&self, upstream: SocketAddr) {
        self.upstream.send_replace(upstream);
    }

    /// How many client connections are open through the proxy now.
    pub(crate) fn open_connections(&self) -> usize {
        self.counts.open.load(Ordering::Relaxed)
    }

    /// How many client connections the proxy has accepted since it started.
    pub(crate) fn accepted_connections(&self) -> usize {
        self.counts.accepted.load(Ordering::Relaxed)
    }

    /// Hangs, cuts off or restores the traffic of every connection, open or new.
    pub(crate) fn set(&self, traffic: Traffic) {
        self.traffic.send_replace(traffic);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The connection tasks live in the accept task's `JoinSet`, which
        // aborts them when it is dropped.
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: watch::Receiver<SocketAddr>,
    traffic: watch::Receiver<Traffic>,
    counts: Arc<Counts>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let upstream = *upstream.borrow();
                    let open = Open::new(&counts);
                    let traffic = traffic.clone();
                    connections.spawn(async move {
                        forward(client, upstream, traffic).await;
                        drop(open);
                    });
                }
                // Out of file descriptors, say: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Forget finished connections, so that the set does not grow.
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Serves one client connection until either side closes it or the proxy
/// cuts it off. Dropping the sockets on return closes both.
async fn forward(client: TcpStream, upstream: SocketAddr, mut traffic: watch::Receiver<Traffic>) {
    // A connection made during a hang waits here, one made while cut off is
    // closed at once.
    if !flowing(&mut traffic).await {
        return;
    }
    // Nothing listens upstream (the API server is stopped): close the
    // client's connection, as a refused one would be.
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Requests and responses are small writes that must not wait for acks.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Either direction failing or being cut off ends both.
    let _ = tokio::try_join!(
        copy(client_read, server_write, traffic.clone()),
        copy(server_read, client_write, traffic),
    );
}

/// Copies `from` to `to` until `from` ends, holding still while the proxy
/// hangs, and failing as soon as it is cut off.
///
/// `copy_bidirectional` cannot be paused without losing the bytes in its
/// buffers, so this loop keeps its own buffer across a hang: when traffic
/// flows again, the connection carries on where it stopped.
async fn copy(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut traffic: watch::Receiver<Traffic>,
) -> io::Result<()> {
    let cut_off = || io::Error::from(io::ErrorKind::ConnectionAborted);
    let mut buf = vec![0; 64 * 1024];
    loop {
        if !flowing(&mut traffic).await {
            return Err(cut_off());
        }
        let read = tokio::select! {
            biased;
            // A fault is seen before any more bytes are read; reading is cancel safe.
            _ = traffic.changed() => continue,
            read = from.read(&mut buf) => read?,
        };
        if read == 0 {
            return to.shutdown().await;
        }
        // Bytes already read are delivered even if a hang begins meanwhile.
        tokio::select! {
            biased;
            _ = traffic.wait_for(|t| *t == Traffic::CutOff) => return Err(cut_off()),
            written = to.write_all(&buf[..read]) => written?,
        }
    }
}

/// Waits while the proxy hangs; then whether traffic may flow, which it may
/// not once it is cut off or the proxy is gone.
async fn flowing(traffic: &mut watch::Receiver<Traffic>) -> bool {
    matches!(
        traffic.wait_for(|t| *t != Traffic::Hung).await.as_deref(),
        Ok(Traffic::Flowing)
    )
}
