//! Leader election on a `coordination.k8s.io/v1` Lease.

use std::sync::Arc;

use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    error::Error,
    gate::Validity,
    lease::{Holder, LeaseLock},
    timing::{LeaseParams, Timings, jittered, random},
};

/// Leader election for a [`Manager`](crate::Manager): of the replicas that
/// share a Lease, one runs the controllers and the others wait.
///
/// The Lease lives in the cluster of [`client`](LeaseParams::client) (by default the
/// local one, from `Client::try_default`), in [`namespace`](LeaseParams::namespace)
/// (by default the client's own: the pod's namespace in a cluster, the
/// kubeconfig context's outside). Timings default to controller-runtime's:
/// a lease of 15 s, a renew deadline of 10 s, a retry period of 2 s.
///
/// The leader renews the Lease every retry period. If no renew succeeds for
/// the renew deadline, measured on its own clock from the start of the last
/// renew that did, it stops: no reconcile starts after that instant, the
/// running ones are stopped at it, and the manager ends with
/// [`Error::LeadershipLost`]. Another replica takes the Lease only once it
/// has seen the same record, unchanged, for the lease duration, which is
/// longer; so two replicas never reconcile at once, whatever the network
/// does, as long as their clocks run at the same rate. On a graceful stop
/// the leader releases the Lease once its reconciles have finished, and a
/// waiting replica takes it on its next try. If [`Manager::run`](crate::Manager::run)'s
/// future is dropped instead, no reconcile starts after and the replica
/// stops leading at once, but the Lease is left to expire.
///
/// The Lease records the holder as the [identity](LeaseParams::identity), `_` and
/// a nonce drawn afresh each time the manager runs. A replica holds the
/// Lease only under that whole string: two processes given one identity
/// never both lead, and a replica restarted after a crash waits for its
/// previous run's record to run out (the lease duration from when it first
/// sees it), as it would for any other holder's. [`status`](Self::status)
/// tells where this replica stands.
///
/// ```
/// use std::time::Duration;
/// use kube_multicluster_manager::{LeaderElection, LeaseParams};
///
/// let election = LeaderElection::new("my-operator").lease(
///     LeaseParams::default()
///         .namespace("operators")
///         .lease_duration(Duration::from_secs(30))
///         .renew_deadline(Duration::from_secs(20))
///         .retry_period(Duration::from_secs(4)),
/// );
/// assert!(election.validate().is_ok());
/// let deadline_too_long = LeaseParams::default().renew_deadline(Duration::from_secs(20));
/// assert!(LeaderElection::new("x").lease(deadline_too_long).validate().is_err());
/// ```
#[derive(Clone)]
pub struct LeaderElection {
    pub(crate) name: String,
    pub(crate) lease: LeaseParams,
    pub(crate) status: ElectionStatus,
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl LeaderElection {
    /// Election on the Lease `name`, with the defaults above.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            lease: LeaseParams::default(),
            status: ElectionStatus::default(),
        }
    }

    /// Where the Lease is kept and how it is held (default
    /// [`LeaseParams::default`]).
    pub fn lease(mut self, lease: LeaseParams) -> Self {
        self.lease = lease;
        self
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A live view of this replica's [`Role`], for logs, health checks and
    /// tests; the same handle before and while the manager runs.
    ///
    /// ```
    /// use kube_multicluster_manager::{LeaderElection, Role};
    ///
    /// let election = LeaderElection::new("my-operator");
    /// assert_eq!(election.status().role(), Role::Standby);
    /// ```
    pub fn status(&self) -> ElectionStatus {
        self.status.clone()
    }

    /// Checks the timings and the name: lease duration > renew deadline >
    /// 1.2 × retry period, as client-go requires.
    pub fn validate(&self) -> Result<(), Error> {
        if self.name.is_empty() {
            return Err(Error::Invalid {
                what: "leader election".into(),
                reason: "the Lease needs a name".into(),
            });
        }
        self.lease
            .timings
            .validate(&format!("leader election on Lease {:?}", self.name))
    }
}

/// Where a replica stands in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Waiting to take the Lease.
    Standby,
    /// Holding the Lease: the controllers run.
    Leading,
    /// Stopped leading: the Lease was lost or released, or the manager's
    /// future was dropped.
    Stopped,
}

/// Where a replica stands in its election, as it changes; see
/// [`LeaderElection::status`].
#[derive(Debug, Clone)]
pub struct ElectionStatus {
    role: watch::Sender<Role>,
}

impl Default for ElectionStatus {
    fn default() -> Self {
        Self {
            role: watch::Sender::new(Role::Standby),
        }
    }
}

impl ElectionStatus {
    /// The replica's role now: [`Role::Standby`] until it leads, and
    /// [`Role::Stopped`] once the manager has stopped leading, however it
    /// stopped.
    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// Waits until the replica's role is `role` (at once if it is now). A
    /// failover test or a readiness hook awaits `Role::Leading` on a
    /// standby instead of polling [`role`](Self::role).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use kube_multicluster_manager::{LeaderElection, Role};
    ///
    /// let status = LeaderElection::new("my-operator").status();
    /// // A standby before its manager runs.
    /// status.became(Role::Standby).await;
    /// # }
    /// ```
    pub async fn became(&self, role: Role) {
        let mut changes = self.role.subscribe();
        // The sender lives in `self`, so the channel cannot close here.
        let _ = changes.wait_for(|now| *now == role).await;
    }

    /// Every change of the replica's role from now on, as a stream (its
    /// first item is the role now). Roles that change faster than they are
    /// read are merged: the stream yields the latest.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use futures::StreamExt;
    /// use kube_multicluster_manager::{LeaderElection, Role};
    ///
    /// let status = LeaderElection::new("my-operator").status();
    /// let mut roles = std::pin::pin!(status.changes());
    /// assert_eq!(roles.next().await, Some(Role::Standby));
    /// # }
    /// ```
    pub fn changes(&self) -> impl futures::Stream<Item = Role> + Send + 'static {
        let changes = self.role.subscribe();
        futures::stream::unfold((changes, true), |(mut changes, first)| async move {
            if !first && changes.changed().await.is_err() {
                return None;
            }
            let role = *changes.borrow_and_update();
            Some((role, (changes, false)))
        })
    }

    pub(crate) fn sender(&self) -> watch::Sender<Role> {
        self.role.clone()
    }
}

/// A replica's identity when none is given: the host name and a random
/// suffix.
pub(crate) fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    format!("{host}_{:016x}", random())
}

/// Runs the election until `stop` says so or leadership is lost: takes the
/// Lease, opens `validity` while it is held, and releases it when stopped.
/// `role` follows along.
pub(crate) async fn lead(
    mut lock: LeaseLock,
    timings: Timings,
    validity: Arc<Validity>,
    role: watch::Sender<Role>,
    stop: CancellationToken,
    release: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), Error> {
    let key = lock.key();
    let timeout = timings.request_timeout();
    // A status shared with an earlier run says Stopped until now.
    role.send_replace(Role::Standby);
    // Take the Lease.
    let mut until = loop {
        let start = Instant::now();
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                role.send_replace(Role::Stopped);
                return Ok(());
            }
            attempt = tokio::time::timeout(timeout, lock.try_acquire_or_renew()) => {
                match attempt {
                    Ok(Ok(Holder::Me)) => break start + timings.renew_deadline,
                    Ok(Ok(Holder::Other(holder))) => {
                        tracing::debug!(lease = %key, %holder, "the Lease is held; waiting");
                    }
                    Ok(Err(error)) => tracing::warn!(lease = %key, %error, "taking the Lease"),
                    Err(_) => tracing::warn!(lease = %key, ?timeout, "taking the Lease: no answer in time"),
                }
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => {
                role.send_replace(Role::Stopped);
                return Ok(());
            }
            _ = tokio::time::sleep(jittered(timings.retry_period)) => {}
        }
    };
    tracing::info!(lease = %key, holder = lock.holder(), "leading");
    validity.open_until(until);
    role.send_replace(Role::Leading);
    // Keep it.
    let missed = format!(
        "no renew succeeded within the renew deadline ({:?})",
        timings.renew_deadline
    );
    let mut next = Instant::now() + timings.retry_period;
    let lost = loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break None,
            _ = tokio::time::sleep_until(until) => break Some(missed.clone()),
            _ = tokio::time::sleep_until(next) => {}
        }
        let start = Instant::now();
        let attempt = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(until) => break Some(missed.clone()),
            attempt = tokio::time::timeout(timeout, lock.try_acquire_or_renew()) => attempt,
        };
        match attempt {
            Ok(Ok(Holder::Me)) => {
                until = start + timings.renew_deadline;
                validity.open_until(until);
                next = start + timings.retry_period;
            }
            Ok(Ok(Holder::Other(holder))) => {
                break Some(format!("the Lease is held by {holder:?}"));
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %key, %error, "renewing the Lease");
                next = Instant::now() + timings.retry_period / 2;
            }
            Err(_) => {
                tracing::warn!(lease = %key, ?timeout, "renewing the Lease: no answer in time");
                next = Instant::now();
            }
        }
    };
    validity.close();
    role.send_replace(Role::Stopped);
    match lost {
        Some(reason) => {
            tracing::error!(lease = %key, %reason, "leadership lost");
            Err(Error::LeadershipLost { lease: key, reason })
        }
        None if !release.load(std::sync::atomic::Ordering::SeqCst) => {
            tracing::warn!(lease = %key, "reconciles did not end: the Lease is left to expire, not released");
            Ok(())
        }
        None => {
            // The manager stops here once its reconciles have finished.
            match tokio::time::timeout(timings.renew_deadline, lock.release()).await {
                Ok(Ok(())) => tracing::info!(lease = %key, "released the Lease"),
                Ok(Err(error)) => tracing::warn!(lease = %key, %error, "releasing the Lease"),
                Err(_) => tracing::warn!(lease = %key, "releasing the Lease: no answer in time"),
            }
            Ok(())
        }
    }
}
