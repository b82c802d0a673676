//! The webhook server in a manager's run: started on every replica before
//! anything else (admission must not wait for a leader), registered by
//! whoever reconciles (the leader, each shard owner for its own clusters,
//! or the only replica), and stopped as the run ends.

use std::net::SocketAddr;

use kube_fleet::Fleet;
use kube_fleet_webhook::{WebhookServer, WebhookStatus, Webhooks};
use prometheus_client::registry::Registry;

use super::stop::Tasks;
use crate::error::Error;

/// Webhooks as added to the manager, and where to serve them.
pub(crate) struct Setup {
    pub(crate) webhooks: Webhooks,
    pub(crate) listener: Listener,
}

pub(crate) enum Listener {
    Bind(SocketAddr),
    Bound(std::net::TcpListener),
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("webhooks", &self.webhooks)
            .finish_non_exhaustive()
    }
}

/// The server while the run lasts.
pub(crate) struct Running {
    server: WebhookServer,
    registering: bool,
}

impl Running {
    /// Starts serving. Replicas that share requests (with leader election
    /// or sharding) must share the token key, or a request that reaches
    /// another replica than the one that registered it would be denied.
    pub(crate) fn start(
        setup: Setup,
        fleet: &Fleet,
        registry: &mut Registry,
        replicated: bool,
    ) -> Result<Self, Error> {
        let Setup { webhooks, listener } = setup;
        if replicated && !webhooks.has_shared_key() {
            return Err(Error::Invalid {
                what: format!("webhooks {:?}", webhooks.name()),
                reason: "with leader election or sharding, every replica serves the webhooks and must know each cluster's token: give them one key (Webhooks::token_key_file, a Secret mounted in every replica)".into(),
            });
        }
        let listener = match listener {
            Listener::Bound(listener) => listener,
            Listener::Bind(address) => std::net::TcpListener::bind(address)
                .map_err(|source| Error::Serve { address, source })?,
        };
        let server = webhooks.start(fleet, listener, Some(registry))?;
        tracing::info!(address = %server.local_addr(), "serving the webhooks");
        Ok(Self {
            server,
            registering: false,
        })
    }

    pub(crate) fn status(&self) -> WebhookStatus {
        self.server.status()
    }

    /// Starts writing the registrations, for as long as the run lasts.
    pub(crate) fn register(&mut self, tasks: &mut Tasks) {
        if self.registering {
            return;
        }
        self.registering = true;
        let run = tokio::spawn(self.server.register());
        tasks.0.push(run.abort_handle());
    }

    /// Stops serving as the run ends; after a clean run, and if asked,
    /// removes the registrations this replica wrote first.
    pub(crate) async fn end(self, clean: bool) {
        match (clean, self.registering) {
            (true, true) => self.server.shutdown().await,
            (true, false) => self.server.stop().await,
            (false, _) => drop(self.server),
        }
    }
}
