use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::Stream;
use tokio::sync::mpsc;

use super::ClusterEvent;
use crate::{client::ClusterClient, cluster_name::ClusterName};

/// A provider driven from code: add and remove clusters through a
/// [`ProgrammaticHandle`].
///
/// ```no_run
/// # async fn example(east: kube::Client) {
/// use kube_multicluster::{Fleet, provider::ProgrammaticProvider};
///
/// let fleet = Fleet::new();
/// let (provider, handle) = ProgrammaticProvider::new();
/// tokio::spawn({
///     let fleet = fleet.clone();
///     async move { fleet.run(provider).await }
/// });
/// handle.engage("east", east);
/// handle.disengage("east");
/// # }
/// ```
#[derive(Debug)]
pub struct ProgrammaticProvider {
    events: mpsc::UnboundedReceiver<ClusterEvent>,
}

/// Adds clusters to and removes them from a [`ProgrammaticProvider`].
///
/// Cloneable; the provider's stream ends when every handle is dropped.
#[derive(Debug, Clone)]
pub struct ProgrammaticHandle {
    events: mpsc::UnboundedSender<ClusterEvent>,
}

impl ProgrammaticProvider {
    /// A provider and the handle that drives it.
    pub fn new() -> (Self, ProgrammaticHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { events: rx }, ProgrammaticHandle { events: tx })
    }
}

impl ProgrammaticHandle {
    /// Engages (or replaces) the cluster `name`, reached through `client`.
    ///
    /// Returns `false` if the provider is gone.
    pub fn engage(&self, name: impl Into<ClusterName>, client: impl Into<ClusterClient>) -> bool {
        self.events
            .send(ClusterEvent::Engage {
                name: name.into(),
                client: client.into(),
            })
            .is_ok()
    }

    /// Disengages the cluster `name`. Returns `false` if the provider is gone.
    pub fn disengage(&self, name: impl Into<ClusterName>) -> bool {
        self.events
            .send(ClusterEvent::Disengage { name: name.into() })
            .is_ok()
    }
}

impl Stream for ProgrammaticProvider {
    type Item = ClusterEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ClusterEvent>> {
        self.events.poll_recv(cx)
    }
}
