//! A `coordination.k8s.io/v1` Lease held by one identity at a time.
//!
//! The holder writes `renewTime` while it holds the Lease; another identity
//! may take it once it has seen the same record, unchanged, for the Lease's
//! duration. Expiry is measured on the local clock from when this process
//! first saw the record, never by comparing the server's `renewTime` with
//! the local time, so clocks that disagree between machines do not matter.
//! Every write is a replace at the `resourceVersion` that was read, so of
//! two identities racing for the Lease only one succeeds.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::time::Instant;

/// One identity's handle on a Lease.
#[derive(Debug)]
pub(crate) struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    duration: Duration,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    observed: Option<Observed>,
}

/// The Lease as last read or written, and when its record last changed.
#[derive(Debug)]
struct Observed {
    spec: LeaseSpec,
    /// The Lease's labels, annotations and resource version, which a
    /// write keeps.
    metadata: ObjectMeta,
    at: Instant,
}

/// What of a Lease's metadata a write keeps.
fn kept(metadata: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        labels: metadata.labels.clone(),
        annotations: metadata.annotations.clone(),
        resource_version: metadata.resource_version.clone(),
        ..ObjectMeta::default()
    }
}

/// Who holds a Lease, as one attempt to take or keep it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// This identity holds it.
    Me,
    /// Another identity holds it and its time has not run out.
    Other(String),
}

impl LeaseLock {
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            observed: None,
        }
    }

    /// This lock's identity.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// `namespace/name` of the Lease.
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Takes the Lease if it is free, expired or already ours, and renews it
    /// if ours. The caller times the attempt: a Lease that it holds stays
    /// its own, for others, until at least the lease duration after the
    /// attempt began.
    pub(crate) async fn try_acquire_or_renew(&mut self) -> Result<Holder, kube::Error> {
        let now = Instant::now();
        // Held by this identity as last seen: renew at the version seen,
        // with no read first. Someone else's write since makes it fail, and
        // the full path below reads what they wrote.
        if let Some(seen) = &self.observed
            && seen.spec.holder_identity.as_deref() == Some(self.identity.as_str())
            && seen.metadata.resource_version.is_some()
        {
            let mut next = seen.spec.clone();
            next.renew_time = Some(MicroTime(Timestamp::now()));
            next.lease_duration_seconds = Some(seconds(self.duration));
            let metadata = seen.metadata.clone();
            if let Ok(Holder::Me) = self.replace(next, &metadata, now).await {
                return Ok(Holder::Me);
            }
        }
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return self.create(now).await;
        };
        // A record is dated from when its answer came, never earlier: a
        // renew that committed while the read was under way is seen as no
        // older than it is.
        let now = Instant::now();
        let spec = lease.spec.unwrap_or_default();
        let metadata = kept(&lease.metadata);
        let at = match &self.observed {
            Some(seen) if seen.spec == spec => seen.at,
            _ => now,
        };
        let holder = spec
            .holder_identity
            .clone()
            .filter(|holder| !holder.is_empty());
        let lasts = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        self.observed = Some(Observed {
            spec: spec.clone(),
            metadata: metadata.clone(),
            at,
        });
        if let Some(other) = holder.as_ref().filter(|h| **h != self.identity)
            && at + lasts > now
        {
            return Ok(Holder::Other(other.clone()));
        }
        let stamp = MicroTime(Timestamp::now());
        let mut next = spec.clone();
        if holder.as_deref() != Some(self.identity.as_str()) {
            next.acquire_time = Some(stamp.clone());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        next.holder_identity = Some(self.identity.clone());
        next.renew_time = Some(stamp);
        next.lease_duration_seconds = Some(seconds(self.duration));
        self.replace(next, &metadata, now).await
    }

    /// Gives the Lease up if this identity holds it, so that another takes
    /// it at once: no holder, and a duration of one second.
    pub(crate) async fn release(&mut self) -> Result<(), kube::Error> {
        for _ in 0..3 {
            let Some(lease) = self.api.get_opt(&self.name).await? else {
                return Ok(());
            };
            let spec = lease.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            let stamp = MicroTime(Timestamp::now());
            let next = LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                ..spec
            };
            match self
                .replace(next, &kept(&lease.metadata), Instant::now())
                .await
            {
                Ok(_) => {
                    self.observed = None;
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    async fn create(&mut self, now: Instant) -> Result<Holder, kube::Error> {
        let stamp = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds(self.duration)),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                annotations: (!self.annotations.is_empty()).then(|| self.annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                self.observe(created, now);
                Ok(Holder::Me)
            }
            // Another identity created it first: read it on the next try.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Holder::Other(String::new())),
            Err(error) => Err(error),
        }
    }

    async fn replace(
        &mut self,
        spec: LeaseSpec,
        read: &ObjectMeta,
        now: Instant,
    ) -> Result<Holder, kube::Error> {
        let mut labels = read.labels.clone().unwrap_or_default();
        labels.extend(self.labels.clone());
        let mut annotations = read.annotations.clone().unwrap_or_default();
        annotations.extend(self.annotations.clone());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: read.resource_version.clone(),
                labels: (!labels.is_empty()).then_some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(replaced) => {
                self.observe(replaced, now);
                Ok(Holder::Me)
            }
            // Someone wrote it since it was read (another replica, or a
            // write of this one's that timed out here but went through):
            // an error to try again after, within the renew deadline.
            Err(error) => Err(error),
        }
    }

    fn observe(&mut self, lease: Lease, now: Instant) {
        self.observed = Some(Observed {
            metadata: kept(&lease.metadata),
            spec: lease.spec.unwrap_or_default(),
            at: now,
        });
    }

    /// Takes in the Lease as read elsewhere (a list of Leases) at `now`: a
    /// record seen unchanged keeps the time it was first seen.
    pub(crate) fn saw(&mut self, lease: &Lease, now: Instant) {
        let spec = lease.spec.clone().unwrap_or_default();
        let at = match &self.observed {
            Some(seen) if seen.spec == spec => seen.at,
            _ => now,
        };
        self.observed = Some(Observed {
            spec,
            metadata: kept(&lease.metadata),
            at,
        });
    }

    /// Whether the Lease, as last seen, is held by another identity whose
    /// time has not run out: no need to ask the API server.
    pub(crate) fn held_by_other(&self, now: Instant) -> bool {
        self.observed.as_ref().is_some_and(|seen| {
            let holder = seen.spec.holder_identity.as_deref().unwrap_or_default();
            let lasts = seen.spec.lease_duration_seconds.unwrap_or(0).max(0) as u64;
            !holder.is_empty()
                && holder != self.identity
                && seen.at + Duration::from_secs(lasts) > now
        })
    }

    /// Labels and annotations the Lease carries when this lock creates it.
    pub(crate) fn with_metadata(
        mut self,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    ) -> Self {
        self.labels = labels;
        self.annotations = annotations;
        self
    }
}

/// A duration in whole seconds, rounded up, at least one.
pub(crate) fn seconds(duration: Duration) -> i32 {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    whole.clamp(1, i32::MAX as u64) as i32
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::seconds;

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(15)), 15);
        assert_eq!(seconds(Duration::from_millis(15_001)), 16);
        assert_eq!(seconds(Duration::ZERO), 1);
    }
}
