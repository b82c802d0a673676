//! The webhook server in a manager's run: started on every replica before
//! anything else (admission must not wait for a leader), registered by
//! whoever reconciles (the leader, each shard owner for its own clusters,
//! or the only replica), and stopped as the run ends.

use std::net::SocketAddr;

use kube_multicluster::Fleet;
use kube_multicluster_webhook::{WebhookServer, WebhookStatus, Webhooks};
use prometheus_client::registry::Registry;

use tokio::sync::watch;

use super::stop::Tasks;
use crate::{election::Role, error::Error};

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
    /// The registration's task, while it runs.
    registering: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Starts serving. Replicas that share requests (with leader election
    /// or sharding) must share the token key and the certificate, or a
    /// request that reaches another replica than the one that registered it
    /// would be denied, or refused at the handshake.
    pub(crate) fn start(
        setup: Setup,
        fleet: &Fleet,
        registry: &mut Registry,
        replicated: bool,
    ) -> Result<Self, Error> {
        let Setup { webhooks, listener } = setup;
        if replicated {
            let refused = |reason: &str| Error::Invalid {
                what: format!("webhooks {:?}", webhooks.name()),
                reason: format!(
                    "with leader election or sharding, every replica serves the webhooks, so {reason}"
                ),
            };
            if !webhooks.has_shared_key() {
                return Err(refused(
                    "they must know each cluster's token: give them one key (Webhooks::token_key_file, a Secret mounted in every replica)",
                ));
            }
            if webhooks.generates_certificates() {
                return Err(refused(
                    "they must serve one certificate that the registrations' CA bundle trusts: give them files (Certificates::files, a Secret mounted in every replica)",
                ));
            }
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
            registering: None,
        })
    }

    pub(crate) fn status(&self) -> WebhookStatus {
        self.server.status()
    }

    /// Starts writing the registrations, until `role` stops leading (at
    /// once, without an election) or the run ends.
    pub(crate) fn register(&mut self, tasks: &mut Tasks, mut role: watch::Receiver<Role>) {
        if self.registering.is_some() {
            return;
        }
        let register = self.server.register();
        let run = tokio::spawn(async move {
            tokio::select! {
                () = register => {}
                _ = role.wait_for(|role| *role != Role::Leading) => {}
            }
        });
        tasks.0.push(run.abort_handle());
        self.registering = Some(run);
    }

    /// Stops writing the registrations; then, after a clean run and if
    /// asked, removes them from every cluster. Called while this replica
    /// still leads, with its election polled beside it, so that it cannot
    /// remove what the next leader writes: the run drops it if leadership
    /// goes.
    pub(crate) async fn stop_registering(&mut self, clean: bool) {
        let Some(registering) = self.registering.take() else {
            return;
        };
        registering.abort();
        // Ended, so that no write of its own lands after the removal.
        let _ = registering.await;
        if clean && self.server.unregisters_on_shutdown() {
            for (cluster, error) in self.server.unregister().await {
                tracing::warn!(cluster = cluster.as_str(), %error, "removing the webhook registrations at shutdown");
            }
        }
    }

    /// Stops serving as the run ends: after a clean run, the requests in
    /// flight are let finish first.
    pub(crate) async fn end(self, clean: bool) {
        if clean {
            self.server.stop().await;
        }
    }
}
