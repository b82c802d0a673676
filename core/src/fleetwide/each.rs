//! The same work in many clusters, with bounded concurrency and an outcome
//! per cluster.

use std::{fmt, future::Future, time::Duration};

use futures::{FutureExt, StreamExt};
use tower::BoxError;

use crate::{
    cluster::Cluster,
    cluster_name::ClusterName,
    panic::{contain, panic_message},
};

/// What [`for_each_cluster`] did in each cluster: the value or the error,
/// in the order the clusters were given.
#[derive(Debug)]
pub struct PerCluster<T> {
    /// Each cluster's outcome.
    pub outcomes: Vec<(ClusterName, Result<T, BoxError>)>,
}

impl<T> PerCluster<T> {
    /// The clusters where the work failed, with their errors.
    pub fn errors(&self) -> impl Iterator<Item = (&ClusterName, &BoxError)> {
        self.outcomes
            .iter()
            .filter_map(|(cluster, outcome)| outcome.as_ref().err().map(|error| (cluster, error)))
    }

    /// The clusters where the work succeeded, with their values.
    pub fn successes(&self) -> impl Iterator<Item = (&ClusterName, &T)> {
        self.outcomes
            .iter()
            .filter_map(|(cluster, outcome)| outcome.as_ref().ok().map(|value| (cluster, value)))
    }

    /// Whether the work succeeded in every cluster.
    pub fn all_ok(&self) -> bool {
        self.outcomes.iter().all(|(_, outcome)| outcome.is_ok())
    }

    /// The values if every cluster succeeded; otherwise every failure, as
    /// one error that names each cluster (for a reconciler to return, so
    /// that its key is retried).
    pub fn into_result(self) -> Result<Vec<(ClusterName, T)>, ClusterErrors> {
        let mut values = Vec::with_capacity(self.outcomes.len());
        let mut failures = Vec::new();
        for (cluster, outcome) in self.outcomes {
            match outcome {
                Ok(value) => values.push((cluster, value)),
                Err(error) => failures.push((cluster, error)),
            }
        }
        if failures.is_empty() {
            Ok(values)
        } else {
            Err(ClusterErrors {
                failures,
                of: values.len(),
            })
        }
    }
}

/// The clusters where some work failed, each with its error.
///
/// Displays as `2 of 5 clusters failed: east: <error>; west: <error>`.
#[derive(Debug)]
pub struct ClusterErrors {
    /// Each failed cluster and its error.
    pub failures: Vec<(ClusterName, BoxError)>,
    /// How many clusters succeeded.
    of: usize,
}

impl fmt::Display for ClusterErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.failures.len() + self.of;
        write!(f, "{} of {total} clusters failed: ", self.failures.len())?;
        for (i, (cluster, error)) in self.failures.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {error}", shown(cluster))?;
        }
        Ok(())
    }
}

impl std::error::Error for ClusterErrors {}

/// The work in a cluster gave no answer within its timeout.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub(crate) struct NoAnswer(Duration);

/// The cluster left the fleet before its turn.
#[derive(Debug, thiserror::Error)]
#[error("cluster {} left the fleet", shown(.0))]
pub(crate) struct Left(ClusterName);

/// The work in a cluster panicked.
#[derive(Debug, thiserror::Error)]
#[error("the work panicked: {0}")]
pub(crate) struct Panicked(String);

/// Whether `error` says that a cluster gave no answer or had left (rather
/// than answering with an error, or the work failing on its own).
pub(crate) fn unanswered(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<NoAnswer>() || error.is::<Left>()
}

/// A cluster's name in a message: the local cluster's is empty.
pub(crate) fn shown(name: &ClusterName) -> &str {
    if name.is_local() {
        "(local)"
    } else {
        name.as_str()
    }
}

/// Runs `work` in each of `clusters`, at most `concurrency` at once (at
/// least one), giving each cluster at most `timeout`, and collects every
/// cluster's outcome: a cluster that fails, hangs or has left does not stop
/// the work in the others. A cluster that has left before its turn is
/// skipped with an error saying so; one whose work outlasts `timeout` has
/// that work dropped (cancelled) and an error naming the timeout.
///
/// ```no_run
/// # use std::time::Duration;
/// # use kube_multicluster::{Fleet, fleetwide::for_each_cluster};
/// # async fn example(fleet: Fleet) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let versions = for_each_cluster(fleet.clusters(), 16, Duration::from_secs(10), |cluster| async move {
///     Ok(cluster.client().apiserver_version().await?.git_version)
/// })
/// .await
/// .into_result()?; // every cluster answered, or an error naming each that did not
/// # Ok(())
/// # }
/// ```
pub async fn for_each_cluster<T, F, Fut>(
    clusters: impl IntoIterator<Item = Cluster>,
    concurrency: usize,
    timeout: Duration,
    mut work: F,
) -> PerCluster<T>
where
    F: FnMut(Cluster) -> Fut,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let runs = clusters.into_iter().enumerate().map(|(i, cluster)| {
        let name = cluster.name().clone();
        let run: Result<Fut, BoxError> = if cluster.is_engaged() {
            // The work's synchronous part may panic too.
            contain(|| work(cluster)).map_err(|message| Panicked(message).into())
        } else {
            Err(Left(name.clone()).into())
        };
        async move {
            let outcome = async {
                let run = std::panic::AssertUnwindSafe(run?).catch_unwind();
                match tokio::time::timeout(timeout, run).await {
                    Ok(Ok(outcome)) => outcome,
                    Ok(Err(panic)) => Err(Panicked(panic_message(panic.as_ref())).into()),
                    Err(_) => Err(NoAnswer(timeout).into()),
                }
            };
            (i, name, outcome.await)
        }
    });
    let mut outcomes: Vec<_> = futures::stream::iter(runs)
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    outcomes.sort_by_key(|(i, _, _)| *i);
    PerCluster {
        outcomes: outcomes
            .into_iter()
            .map(|(_, name, outcome)| (name, outcome))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use super::*;

    fn cluster(name: &str) -> Cluster {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        Cluster::new(name, kube::Client::new(service, "default"))
    }

    #[tokio::test(start_paused = true)]
    async fn every_cluster_has_its_outcome_and_a_hung_one_times_out_alone() {
        let clusters = vec![cluster("a"), cluster("b"), cluster("c"), cluster("d")];
        let at_once = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let done = for_each_cluster(clusters, 2, Duration::from_secs(5), |cluster| {
            let (at_once, most) = (at_once.clone(), most.clone());
            async move {
                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let outcome = match cluster.name().as_str() {
                    "b" => Err("refused".into()),
                    "c" => futures::future::pending().await,
                    name => Ok(name.len()),
                };
                at_once.fetch_sub(1, Ordering::SeqCst);
                outcome
            }
        })
        .await;
        assert_eq!(most.load(Ordering::SeqCst), 2, "two at a time");
        let names: Vec<_> = done.outcomes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"], "in the order given");
        let failed: Vec<_> = done.errors().map(|(n, e)| format!("{n}: {e}")).collect();
        assert_eq!(failed, ["b: refused", "c: no answer within 5s"]);
        assert_eq!(done.successes().count(), 2);
        let error = done.into_result().unwrap_err();
        assert_eq!(
            error.to_string(),
            "2 of 4 clusters failed: b: refused; c: no answer within 5s"
        );
    }

    #[tokio::test]
    async fn work_that_panics_in_one_cluster_is_that_cluster_s_error() {
        let done = for_each_cluster(
            [cluster("a"), cluster("b")],
            2,
            Duration::from_secs(1),
            |cluster| async move {
                if cluster.name() == "a" {
                    panic!("bad input in a");
                }
                Ok::<_, BoxError>(())
            },
        )
        .await;
        let failed: Vec<_> = done.errors().map(|(n, e)| format!("{n}: {e}")).collect();
        assert_eq!(failed, ["a: the work panicked: bad input in a"]);
        assert_eq!(done.successes().count(), 1);
    }

    #[tokio::test]
    async fn a_cluster_that_left_is_reported_not_worked_on() {
        let fleet = crate::fleet::Fleet::new();
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let gone = fleet.engage("gone", kube::Client::new(service, "default"));
        fleet.disengage("gone");
        let done = for_each_cluster([gone], 4, Duration::from_secs(1), |_| async {
            Ok::<_, BoxError>(())
        })
        .await;
        let failed: Vec<_> = done.errors().map(|(_, e)| e.to_string()).collect();
        assert_eq!(failed, ["cluster gone left the fleet"]);
    }
}
