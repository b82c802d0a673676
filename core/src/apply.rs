//! Server-side apply and status conditions, the writes most reconcilers
//! make, without their boilerplate.
//!
//! - [`apply`] applies an object as a field manager, forcing ownership of
//!   the fields it sets, after dropping what a server-side apply must not
//!   carry (its version, UID, managed fields, status). Build the object
//!   with only the fields your controller means to own: applying an object
//!   read from the cache would take every field it holds (other
//!   controllers' labels and finalizers among them), and fields you own
//!   stay as you applied them until you apply without them.
//! - [`apply_status`] applies only the status subresource: the body is made
//!   from the type's API version and kind, the name and the status you give.
//! - [`set_condition`] adds or updates a `metav1.Condition` in a list,
//!   moving its `lastTransitionTime` only when its status changes.
//!
//! ```no_run
//! use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::Condition};
//! use kube::Api;
//! use kube_multicluster::apply::{apply, set_condition};
//!
//! # async fn example(api: Api<ConfigMap>) -> Result<(), kube::Error> {
//! let mut config_map = ConfigMap::default();
//! config_map.metadata.name = Some("settings".into());
//! config_map.data = Some([("mode".to_owned(), "fast".to_owned())].into());
//! apply(&api, "my-controller", &config_map).await?;
//!
//! let mut conditions: Vec<Condition> = Vec::new();
//! let changed = set_condition(&mut conditions, "Ready", true, "Applied", "the copy is current", Some(3));
//! assert!(changed && conditions[0].status == "True");
//! # Ok(())
//! # }
//! ```

use std::fmt::Debug;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

/// Applies `object` through `api` as `manager` (server-side apply, forcing
/// conflicts: the manager takes the fields it sets). `metadata.managedFields`,
/// `resourceVersion`, `uid`, `creationTimestamp`, `generation` and `status`
/// are dropped first; apply the status with [`apply_status`]. Build
/// `object` with only the fields the manager owns (see the
/// [module docs](self)). Returns the object as the server has it after the
/// apply.
pub async fn apply<K>(api: &Api<K>, manager: &str, object: &K) -> Result<K, kube::Error>
where
    K: Resource + Serialize + Clone + DeserializeOwned + Debug,
{
    let mut body = serde_json::to_value(object).map_err(kube::Error::SerdeError)?;
    if let Some(body) = body.as_object_mut() {
        body.remove("status");
        if let Some(Value::Object(metadata)) = body.get_mut("metadata") {
            for field in [
                "managedFields",
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "selfLink",
            ] {
                metadata.remove(field);
            }
        }
    }
    api.patch(
        &object.name_any(),
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// Applies `status` as the status of the object `name` through `api`'s
/// `status` subresource, as `manager` (forcing conflicts). The type needs a
/// status subresource (CRDs declare one with `subresources: status`).
pub async fn apply_status<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    status: impl Serialize,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// Sets the condition `type_` in `conditions` to `status`, with `reason`,
/// `message` and `observed_generation`, and returns whether anything
/// changed. A new condition, or one whose status changes, gets the current
/// time as its `lastTransitionTime`; otherwise that time is kept, as
/// Kubernetes' own `meta.SetStatusCondition` does.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" };
    let now = || Time(Timestamp::now());
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) else {
        conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation,
            last_transition_time: now(),
        });
        return true;
    };
    let mut changed = false;
    if existing.status != status {
        existing.status = status.to_owned();
        existing.last_transition_time = now();
        changed = true;
    }
    for (field, value) in [
        (&mut existing.reason, reason),
        (&mut existing.message, message),
    ] {
        if field != value {
            *field = value.to_owned();
            changed = true;
        }
    }
    if existing.observed_generation != observed_generation {
        existing.observed_generation = observed_generation;
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_moves_its_transition_time_only_when_its_status_changes() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Waiting",
            "",
            Some(1)
        ));
        let first = conditions[0].last_transition_time.clone();
        assert!(!set_condition(
            &mut conditions,
            "Ready",
            false,
            "Waiting",
            "",
            Some(1)
        ));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Still",
            "slow",
            Some(2)
        ));
        assert_eq!(conditions[0].last_transition_time, first, "same status");
        assert_eq!(
            (
                conditions[0].reason.as_str(),
                conditions[0].observed_generation
            ),
            ("Still", Some(2))
        );
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            "Done",
            "",
            Some(2)
        ));
        assert!(
            conditions[0].last_transition_time.0 > first.0,
            "status changed"
        );
        assert!(set_condition(
            &mut conditions,
            "Synced",
            true,
            "Done",
            "",
            None
        ));
        assert_eq!(conditions.len(), 2);
    }
}
