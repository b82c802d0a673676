//! A cluster's cache: one shared watch per type (and watch configuration),
//! whatever the number of controllers that read it.
//!
//! [`ClusterCache::watch`] starts a [`SharedWatch`] the first time a type is
//! asked for and hands the same one to every later caller. Each caller that
//! wants to hear of changes takes a [`Subscription`]: a stream of the objects
//! that changed, merged per object while it has not read them, so a slow
//! reader costs memory in proportion to the objects, never to the versions
//! it missed. A watch lives as long as someone holds it (a controller, a
//! subscription): the last one to let go stops it at the API server.
//! Cached objects carry no `metadata.managedFields` (a controller's
//! [`Watch::keep_managed_fields`](crate::controller::Watch::keep_managed_fields)
//! keeps them), and a [`Transform`] given to a controller's watch
//! ([`Watch::transform`](crate::controller::Watch::transform)) drops more.
//!
//! A watch whose `watcher::Config` accepts a list from the API server's
//! cache (`any_semantic()`, or `streaming_lists()`) lists what is there by a
//! *streaming list*: the API server sends the objects as events on the watch
//! itself (`sendInitialEvents=true`), with no LIST request and no page held
//! on either side. kube's default, `ListSemantic::MostRecent`, is a
//! consistent read, which kube's streaming list is not (it reads at resource
//! version `0`, which may be older than what was seen before, and after a
//! relist a store could go back in time), so such watches list in pages of
//! the configuration's `page_size`, as before. An API server whose
//! `WatchList` feature is off refuses a streaming list with `422 Invalid`, as
//! do API servers before Kubernetes 1.27: the watch then lists in pages, and
//! so does every later watch in that cluster. A streaming list that ends
//! before it is complete starts again from nothing: one that ran until its
//! watch timed out (a large list over a slow link), or two in a row cut
//! short, make that watch list in consistent pages for the rest of its life. A configuration without bookmarks (`disable_bookmarks`)
//! always lists in pages: bookmarks mark where a streaming list ends.
//!
//! While a watch lists again (after its watch expired, say), at most two
//! full copies of its objects are alive: the store as it was, which readers
//! go on reading, and the new list, which replaces it at once when complete.
//! Paged lists add one page (500 objects by default) being decoded.
//! Subscribers hold no copies: they read the store's `Arc`s.
//!
//! Across a [`Fleet`](crate::Fleet), at most
//! [`InitialLists::DEFAULT`] watches list at once (see
//! [`FleetConfig::initial_lists`](crate::FleetConfig::initial_lists)): a watch
//! takes a permit before its first request and gives it back once its list
//! is done or failed, so an engage storm lists a bounded number of clusters
//! at a time. A cluster whose connection hangs holds its permit until the
//! client's connect timeout; one that refuses, at once.
//!
//! With a [cache budget](crate::FleetConfig::cache_budget), the fleet also
//! counts the bytes its caches hold: no watch starts its first list while
//! they hold more than the budget, and a first list that would take them
//! past it is dropped whole and made again once room frees up (see
//! [`InitialLists::cached_bytes`] and [`InitialLists::waiting_for_room`]).
//!
//! ```no_run
//! # async fn example(cluster: kube_multicluster::Cluster) {
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::watcher;
//! use kube_multicluster::cache::{Change, WatchState};
//!
//! let watch = cluster.cache().watch::<ConfigMap>(&watcher::Config::default());
//! let mut changes = watch.subscribe();
//! watch.synced().await;
//! assert_eq!(watch.state(), WatchState::Synced);
//! while let Some(change) = changes.next().await {
//!     match change {
//!         Change::Listed(cm) | Change::Applied(cm) => println!("{:?} is there", cm.metadata.name),
//!         Change::Deleted(cm) => println!("{:?} is gone", cm.metadata.name),
//!     }
//! }
//! # }
//! ```

mod budget;
pub(crate) mod discovery;
mod host;
mod initial_list;
mod permits;
mod retry;
pub(crate) mod scoped;
mod selects;
mod source;
pub(crate) mod stand_in;
mod state;
mod subscription;
mod transform;
mod types;
mod watch;

pub use host::{HostCache, HostView, SplitBy};

pub(crate) use budget::Report as BudgetReport;
pub use host::ClusterCache;
pub use permits::InitialLists;
pub use state::{WatchState, WatchStatus};
pub use subscription::{Change, Subscription};
pub(crate) use transform::Shape;
pub use transform::Transform;
pub(crate) use types::{Sealed, scope};
pub use types::{TypeInfo, Watchable, is_namespaced};
pub use watch::SharedWatch;
pub(crate) use watch::{Lookup, WatchProbe};
