//! Token-bucket rate limits for reconciles: shared, or one bucket per cluster.
//!
//! A [`TokenBucket`] refills at `rate` tokens per second up to `burst`, and is
//! `Clone` and shareable: clones draw from the same tokens, so several
//! controllers can share one budget (tower's own `RateLimit` is neither). With
//! [`RateLimitLayer::per_cluster`] each cluster gets a bucket of its own, so a
//! busy cluster cannot use up another's budget.
//!
//! The limit is applied per request, not in `poll_ready`: a request whose
//! cluster is out of tokens waits for its turn inside its own future, with a
//! clone of the inner service that it readies only once its token is due, so
//! it holds no concurrency slot meanwhile and requests for other clusters go
//! ahead. A wait that is cancelled (its cluster left) gives its token back.
//! Put it outside a timeout if the wait should not count against it. Keys
//! waiting here have left the queue: a change to one of them meanwhile
//! queues it again, to run after the waiting reconcile.
//!
//! ```
//! use std::time::Duration;
//! use kube_fleet::{Action, McRequest};
//! use kube_fleet_layers::rate_limit::{RateLimitLayer, TokenBucket};
//! use tower::{BoxError, ServiceBuilder, service_fn};
//!
//! // 10 reconciles per second per cluster, bursts of 20.
//! let per_cluster = RateLimitLayer::per_cluster(10.0, 20);
//! // Or one budget shared by two controllers' stacks.
//! let shared = RateLimitLayer::shared(TokenBucket::new(50.0, 100));
//! let service = ServiceBuilder::new()
//!     .layer(per_cluster)
//!     .service(service_fn(|_: McRequest| async { Ok::<_, BoxError>(Action::await_change()) }));
//! # drop((service, shared));
//! ```

mod bucket;
mod future;
mod layer;
mod service;

pub use bucket::TokenBucket;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimit;
