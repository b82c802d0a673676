//! One request budget for every cluster a provider engages.

use futures::{Stream, StreamExt};

use super::ClusterEvent;
use crate::client::RequestBudget;

/// `provider`, whose clusters each send their requests within `budget`
/// unless the provider gave one a budget of its own
/// ([`ClusterClient::with_budget`](crate::client::ClusterClient::with_budget)).
/// It takes the place of the fleet's budget
/// ([`FleetConfig::request_budget`](crate::FleetConfig::request_budget)) for
/// these clusters only.
///
/// ```
/// use kube_multicluster::{Fleet, client::RequestBudget, provider::{ProgrammaticProvider, with_request_budget}};
///
/// # async fn example() {
/// let (provider, handle) = ProgrammaticProvider::new();
/// // Clusters from this provider may write 20 times a second, 40 at once.
/// let provider = with_request_budget(provider, RequestBudget::DEFAULT.writes(20.0, 40));
/// Fleet::new().run(provider).await;
/// # drop(handle);
/// # }
/// ```
pub fn with_request_budget<P>(
    provider: P,
    budget: RequestBudget,
) -> impl Stream<Item = ClusterEvent> + Send + Unpin + 'static
where
    P: Stream<Item = ClusterEvent> + Send + 'static,
{
    provider
        .map(move |event| match event {
            ClusterEvent::Engage { name, client } if client.budget().is_none() => {
                ClusterEvent::Engage {
                    name,
                    client: client.with_budget(budget),
                }
            }
            event => event,
        })
        .boxed()
}
