//! A `coordination.k8s.io/v1` Lease held by one holder at a time.
//!
//! The holder writes `renewTime` while it holds the Lease; another may take
//! it once it has seen the same record, unchanged, for the Lease's
//! duration. Expiry is measured on the local clock from when this process
//! first saw the record, never by comparing the server's `renewTime` with
//! the local time, so clocks that disagree between machines do not matter.
//! Every write is a replace at the `resourceVersion` that was read, so of
//! two holders racing for the Lease only one succeeds.
//!
//! A holder is written as `<identity>_<nonce>`, the nonce drawn once per
//! run ([`holder_for`]): a process recognises a Lease as its own only by
//! that whole string, so two processes given one identity never both
//! believe they hold it, and a restarted process waits for its previous
//! run's record to run out, as it would for any other holder's.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams, Preconditions},
};
use tokio::time::Instant;

use crate::timing::random;

/// The holder string of a process running as `identity`: the identity, `_`
/// and a random nonce.
pub(crate) fn holder_for(identity: &str) -> String {
    format!("{identity}_{:08x}", random() as u32)
}

/// The identity a holder string was made from by [`holder_for`].
pub(crate) fn identity_of(holder: &str) -> &str {
    holder
        .rsplit_once('_')
        .map_or(holder, |(identity, _)| identity)
}

/// One holder's handle on a Lease.
#[derive(Debug)]
pub(crate) struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    holder: String,
    duration: Duration,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    observed: Option<Observed>,
}

/// A Lease as last read or written, and since when its record has been
/// seen unchanged on the local clock.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    spec: LeaseSpec,
    /// The metadata a write keeps, and the version and uid it is made at.
    metadata: ObjectMeta,
    at: Instant,
}

impl Observed {
    /// `lease` as read at `now`: a record unchanged since `before` keeps
    /// the time it was first seen.
    pub(crate) fn of(lease: &Lease, before: Option<&Observed>, now: Instant) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let at = match before {
            Some(seen) if seen.spec == spec => seen.at,
            _ => now,
        };
        Self {
            spec,
            metadata: ObjectMeta {
                managed_fields: None,
                ..lease.metadata.clone()
            },
            at,
        }
    }

    /// The holder as recorded, if any.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.spec
            .holder_identity
            .as_deref()
            .filter(|holder| !holder.is_empty())
    }

    /// The Lease's annotation `key`, as read.
    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// How long the record lasts from when it was first seen.
    pub(crate) fn lasts(&self) -> Duration {
        Duration::from_secs(self.spec.lease_duration_seconds.unwrap_or(0).max(0) as u64)
    }

    /// When the record runs out, on the local clock.
    pub(crate) fn runs_out(&self) -> Instant {
        self.at + self.lasts()
    }

    /// Whether a holder other than `me` holds it at `now`.
    pub(crate) fn held_by_other(&self, me: &str, now: Instant) -> bool {
        self.holder().is_some_and(|holder| holder != me) && self.runs_out() > now
    }

    /// A delete that succeeds only if the Lease is still this record.
    pub(crate) fn delete_params(&self) -> DeleteParams {
        DeleteParams::default().preconditions(Preconditions {
            resource_version: self.metadata.resource_version.clone(),
            uid: self.metadata.uid.clone(),
        })
    }
}

/// Who holds a Lease, as one attempt to take or keep it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// This holder holds it.
    Me,
    /// Another holder holds it and its time has not run out.
    Other(String),
}

impl LeaseLock {
    /// A lock on the Lease `namespace/name` for `holder`, a string from
    /// [`holder_for`].
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        name: &str,
        holder: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            holder: holder.to_owned(),
            duration,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            observed: None,
        }
    }

    /// The holder string this lock writes.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
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
        // Held by this holder as last seen: renew at the version seen,
        // with no read first. Someone else's write since makes it fail, and
        // the full path below reads what they wrote.
        if let Some(seen) = &self.observed
            && seen.holder() == Some(self.holder.as_str())
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
        let seen = Observed::of(&lease, self.observed.as_ref(), now);
        self.observed = Some(seen.clone());
        if seen.held_by_other(&self.holder, now) {
            return Ok(Holder::Other(seen.holder().unwrap_or_default().to_owned()));
        }
        let stamp = MicroTime(Timestamp::now());
        let mut next = seen.spec.clone();
        if seen.holder() != Some(self.holder.as_str()) {
            next.acquire_time = Some(stamp.clone());
            next.lease_transitions = Some(seen.spec.lease_transitions.unwrap_or(0) + 1);
        }
        next.holder_identity = Some(self.holder.clone());
        next.renew_time = Some(stamp);
        next.lease_duration_seconds = Some(seconds(self.duration));
        self.replace(next, &seen.metadata, now).await
    }

    /// Gives the Lease up if this holder holds it, so that another takes it
    /// at once: no holder, and a duration of one second.
    pub(crate) async fn release(&mut self) -> Result<(), kube::Error> {
        for _ in 0..3 {
            let Some(lease) = self.api.get_opt(&self.name).await? else {
                self.observed = None;
                return Ok(());
            };
            let spec = lease.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
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
            match self.replace(next, &lease.metadata, Instant::now()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(error),
            }
            self.observed = None;
            return Ok(());
        }
        Ok(())
    }

    /// Deletes the Lease if this holder holds it, at the version read: a
    /// Lease another holder has written since stays.
    pub(crate) async fn delete(&mut self) -> Result<(), kube::Error> {
        for _ in 0..3 {
            let Some(lease) = self.api.get_opt(&self.name).await? else {
                self.observed = None;
                return Ok(());
            };
            let seen = Observed::of(&lease, None, Instant::now());
            if seen.holder() != Some(self.holder.as_str()) {
                return Ok(());
            }
            match self.api.delete(&self.name, &seen.delete_params()).await {
                // Deleted, by this call or before it.
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(error),
            }
            self.observed = None;
            return Ok(());
        }
        Ok(())
    }

    async fn create(&mut self, now: Instant) -> Result<Holder, kube::Error> {
        let stamp = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(seconds(self.duration)),
            acquire_time: Some(stamp.clone()),
            renew_time: Some(stamp),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
        let lease = Lease {
            metadata: self.written(&ObjectMeta::default()),
            spec: Some(spec),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                self.observed = Some(Observed::of(&created, None, now));
                Ok(Holder::Me)
            }
            // Another holder created it first: read it on the next try.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Holder::Other(String::new())),
            Err(error) => Err(error),
        }
    }

    /// The metadata of a write over `read`: its version, its owner
    /// references, finalizers, labels and annotations, with this lock's
    /// labels and annotations added.
    fn written(&self, read: &ObjectMeta) -> ObjectMeta {
        let mut labels = read.labels.clone().unwrap_or_default();
        labels.extend(self.labels.clone());
        let mut annotations = read.annotations.clone().unwrap_or_default();
        annotations.extend(self.annotations.clone());
        ObjectMeta {
            name: Some(self.name.clone()),
            resource_version: read.resource_version.clone(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: read.owner_references.clone(),
            finalizers: read.finalizers.clone(),
            ..ObjectMeta::default()
        }
    }

    async fn replace(
        &mut self,
        spec: LeaseSpec,
        read: &ObjectMeta,
        now: Instant,
    ) -> Result<Holder, kube::Error> {
        let lease = Lease {
            metadata: self.written(read),
            spec: Some(spec),
        };
        // An error (someone wrote it since it was read: another replica, or
        // a write of this one's that timed out here but went through) is
        // for the caller to try again after, within the renew deadline.
        let replaced = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        self.observed = Some(Observed::of(&replaced, None, now));
        Ok(Holder::Me)
    }

    /// Takes in the Lease as read elsewhere (a list of Leases) at `now`: a
    /// record seen unchanged keeps the time it was first seen.
    pub(crate) fn saw(&mut self, lease: &Lease, now: Instant) {
        self.observed = Some(Observed::of(lease, self.observed.as_ref(), now));
    }

    /// The Lease as last read or written, if ever.
    pub(crate) fn seen(&self) -> Option<&Observed> {
        self.observed.as_ref()
    }

    /// Whether the Lease, as last seen, is held by another holder whose
    /// time has not run out: no need to ask the API server.
    pub(crate) fn held_by_other(&self, now: Instant) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|seen| seen.held_by_other(&self.holder, now))
    }

    /// Labels and annotations the Lease carries when this lock writes it.
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

    use super::{holder_for, identity_of, seconds};

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(15)), 15);
        assert_eq!(seconds(Duration::from_millis(15_001)), 16);
        assert_eq!(seconds(Duration::ZERO), 1);
    }

    #[test]
    fn a_holder_names_its_identity_and_differs_from_run_to_run() {
        let one = holder_for("host_0123456789abcdef");
        let two = holder_for("host_0123456789abcdef");
        assert_ne!(one, two);
        assert_eq!(identity_of(&one), "host_0123456789abcdef");
        assert_eq!(identity_of(&holder_for("replica-a")), "replica-a");
    }
}
