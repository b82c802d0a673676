//! What the inner provider offers, what the decisions name, and the events
//! that keep the fleet at the clusters that are both.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    time::Duration,
};

use kube::{api::DynamicObject, runtime::watcher};
use kube_multicluster::{
    ClusterName,
    provider::{ClusterEvent, Problems, Seen, SourceChange},
};
use tokio::time::Instant;

use crate::decisions::{self, Decisions};

/// One decision object: which source it came from and its `namespace/name`.
type Key = (usize, String);

/// What one decision object names now.
struct Decision {
    /// `PlacementDecision fleet/web-1`.
    source: String,
    /// The clusters it names, as the inner provider names them, each with
    /// the name the decision gives it.
    names: BTreeMap<ClusterName, String>,
}

impl Decision {
    /// What a problem with its cluster `written` is filed under.
    fn cluster_source(&self, written: &str) -> String {
        format!("{}, cluster \"{written}\"", self.source)
    }
}

pub(crate) struct State {
    sources: Vec<Decisions>,
    problems: Problems,
    /// Each source's watch, for the decisions a relist no longer shows.
    seen: Vec<Seen>,
    /// The inner provider's last engagement of each cluster it has engaged
    /// and not disengaged since.
    offered: HashMap<ClusterName, ClusterEvent>,
    /// Every decision seen and not deleted.
    decisions: HashMap<Key, Decision>,
    /// How many decisions name each cluster.
    named: HashMap<ClusterName, usize>,
    /// The clusters engaged through this provider and not disengaged since.
    engaged: HashSet<ClusterName>,
    /// How long an engaged cluster no decision names any more stays engaged.
    grace: Duration,
    /// The engaged clusters no decision names any more, each with when its
    /// grace ends.
    unnamed: HashMap<ClusterName, Instant>,
    ready: VecDeque<ClusterEvent>,
}

impl State {
    pub(crate) fn new(sources: Vec<Decisions>, problems: Problems, grace: Duration) -> Self {
        Self {
            seen: sources.iter().map(|_| Seen::new()).collect(),
            sources,
            problems,
            offered: HashMap::new(),
            decisions: HashMap::new(),
            named: HashMap::new(),
            engaged: HashSet::new(),
            grace,
            unnamed: HashMap::new(),
            ready: VecDeque::new(),
        }
    }

    /// The next event for the fleet, if any.
    pub(crate) fn next_event(&mut self) -> Option<ClusterEvent> {
        self.ready.pop_front()
    }

    /// When the next grace ends, if any cluster is in one.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.unnamed.values().min().copied()
    }

    /// Disengages the clusters whose grace has ended by `now`.
    pub(crate) fn on_deadline(&mut self, now: Instant) {
        let ended: Vec<_> = self
            .unnamed
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in ended {
            self.unnamed.remove(&name);
            self.update(&name);
        }
    }

    /// The inner provider's `event`: remembered, and handed on if its
    /// cluster is named (or still engaged, in its grace).
    pub(crate) fn on_inner(&mut self, event: ClusterEvent) {
        match &event {
            ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                let name = name.clone();
                if self.is_named(&name) || self.unnamed.contains_key(&name) {
                    // Engaged or not, this is the engagement to hold now.
                    self.engaged.insert(name.clone());
                    self.ready.push_back(event.clone());
                }
                self.offered.insert(name.clone(), event);
                for decision in self.naming(&name) {
                    self.problems
                        .clear(&decision.cluster_source(&decision.names[&name]));
                }
            }
            ClusterEvent::Disengage { name } => {
                self.offered.remove(name);
                self.unnamed.remove(name);
                self.update(name);
                for decision in self.naming(name) {
                    let written = &decision.names[name];
                    self.problems
                        .report(decision.cluster_source(written), unknown(name));
                }
            }
        }
    }

    /// An event of the watch of the decisions of source `index`.
    pub(crate) fn on_decisions(
        &mut self,
        index: usize,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) {
        let watch = self.sources[index].watch_source();
        self.problems.watched(&watch, &event);
        let Ok(event) = event else { return };
        for change in self.seen[index].changes(event, decisions::key) {
            match change {
                SourceChange::Applied(object) => {
                    let source = self.sources[index].source(&object);
                    let (written, malformed) = decisions::named(&object);
                    if malformed.is_empty() {
                        self.problems.clear(&source);
                    } else {
                        self.problems.report(&source, malformed.join("; "));
                    }
                    let names = written
                        .into_iter()
                        .map(|written| (self.sources[index].cluster_name(&written), written))
                        .collect();
                    self.decide((index, decisions::key(&object)), source, names);
                }
                SourceChange::Deleted(key) => {
                    let key = (index, key);
                    if let Some(decision) = self.decisions.get(&key) {
                        let source = decision.source.clone();
                        self.problems.clear(&source);
                        self.decide(key.clone(), source, BTreeMap::new());
                        self.decisions.remove(&key);
                    }
                }
            }
        }
    }

    /// The decision `key` names `names` now.
    fn decide(&mut self, key: Key, source: String, names: BTreeMap<ClusterName, String>) {
        let before = self.decisions.remove(&key).map(|d| d.names);
        let decision = Decision { source, names };
        for (name, written) in before.iter().flatten() {
            if decision.names.get(name) != Some(written) {
                self.problems.clear(&decision.cluster_source(written));
            }
            if !decision.names.contains_key(name) {
                match self.named.get_mut(name) {
                    Some(count) if *count > 1 => *count -= 1,
                    _ => {
                        self.named.remove(name);
                        self.unname(name);
                    }
                }
            }
        }
        for (name, written) in &decision.names {
            if before.as_ref().is_none_or(|b| !b.contains_key(name)) {
                *self.named.entry(name.clone()).or_default() += 1;
                self.unnamed.remove(name);
                self.update(name);
            }
            if !self.offered.contains_key(name) {
                self.problems
                    .report(decision.cluster_source(written), unknown(name));
            }
        }
        self.decisions.insert(key, decision);
    }

    /// No decision names `name` any more: it is disengaged once its grace
    /// ends unless a decision names it again by then. OCM pages its
    /// decisions, and a cluster that moves from one page to another is
    /// taken off one decision before the other names it.
    fn unname(&mut self, name: &ClusterName) {
        if self.grace.is_zero() || !self.engaged.contains(name) {
            self.update(name);
        } else {
            self.unnamed
                .entry(name.clone())
                .or_insert_with(|| Instant::now() + self.grace);
        }
    }

    fn is_named(&self, name: &ClusterName) -> bool {
        self.named.contains_key(name)
    }

    /// The decisions that name `name`.
    fn naming<'a>(&'a self, name: &'a ClusterName) -> impl Iterator<Item = &'a Decision> + 'a {
        self.decisions
            .values()
            .filter(move |decision| decision.names.contains_key(name))
    }

    /// Engages `name` if it is named and offered and not engaged;
    /// disengages it if it is engaged and no longer both (and not in its
    /// grace).
    fn update(&mut self, name: &ClusterName) {
        if self.unnamed.contains_key(name) {
            return;
        }
        let wanted = self.is_named(name) && self.offered.contains_key(name);
        let engaged = self.engaged.contains(name);
        if wanted && !engaged {
            self.engaged.insert(name.clone());
            self.ready.push_back(self.offered[name].clone());
        } else if !wanted && engaged {
            self.engaged.remove(name);
            self.ready
                .push_back(ClusterEvent::Disengage { name: name.clone() });
        }
    }
}

fn unknown(name: &ClusterName) -> String {
    format!("the inner provider offers no cluster \"{name}\" (yet); it is engaged once offered")
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;
    use crate::decisions::placement_decision;

    fn client() -> kube::Client {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn engage(name: &str) -> ClusterEvent {
        ClusterEvent::Engage {
            name: ClusterName::new(name),
            client: client().into(),
        }
    }

    fn disengage(name: &str) -> ClusterEvent {
        ClusterEvent::Disengage {
            name: ClusterName::new(name),
        }
    }

    fn decision(name: &str, clusters: &[&str]) -> DynamicObject {
        let mut object = DynamicObject::new(name, &placement_decision()).within("fleet");
        let decisions: Vec<_> = clusters
            .iter()
            .map(|c| serde_json::json!({ "clusterName": c, "reason": "" }))
            .collect();
        object.data = serde_json::json!({ "status": { "decisions": decisions } });
        object
    }

    /// A state that disengages at once, its watches listed.
    fn state(sources: Vec<Decisions>) -> (State, Problems) {
        state_with_grace(sources, Duration::ZERO)
    }

    fn state_with_grace(sources: Vec<Decisions>, grace: Duration) -> (State, Problems) {
        let problems = Problems::new();
        let mut state = State::new(sources, problems.clone(), grace);
        for index in 0..state.sources.len() {
            state.on_decisions(index, Ok(watcher::Event::Init));
            state.on_decisions(index, Ok(watcher::Event::InitDone));
        }
        (state, problems)
    }

    fn apply(state: &mut State, object: DynamicObject) {
        state.on_decisions(0, Ok(watcher::Event::Apply(object)));
    }

    fn delete(state: &mut State, object: DynamicObject) {
        state.on_decisions(0, Ok(watcher::Event::Delete(object)));
    }

    /// The events handed on, as `+name` and `-name`.
    fn events(state: &mut State) -> Vec<String> {
        std::iter::from_fn(|| state.next_event())
            .map(|event| match event {
                ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                    format!("+{name}")
                }
                ClusterEvent::Disengage { name } => format!("-{name}"),
            })
            .collect()
    }

    fn sources(problems: &Problems) -> Vec<String> {
        problems.current().into_keys().collect()
    }

    #[tokio::test]
    async fn only_named_clusters_are_engaged_and_follow_their_decisions() {
        let (mut state, _) = state(vec![Decisions::placement("fleet", "web")]);
        for name in ["east", "west", "north"] {
            state.on_inner(engage(name));
        }
        assert!(events(&mut state).is_empty());
        apply(&mut state, decision("web-1", &["east"]));
        assert_eq!(events(&mut state), ["+east"]);
        apply(&mut state, decision("web-1", &["east", "west"]));
        assert_eq!(events(&mut state), ["+west"]);
        apply(&mut state, decision("web-1", &["west"]));
        assert_eq!(events(&mut state), ["-east"]);
        // Named again: the inner provider's last engagement is handed on.
        apply(&mut state, decision("web-1", &["west", "east"]));
        assert_eq!(events(&mut state), ["+east"]);
    }

    #[tokio::test]
    async fn a_deleted_decision_takes_only_the_clusters_no_other_names() {
        let (mut state, _) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        state.on_inner(engage("west"));
        apply(&mut state, decision("web-1", &["east", "west"]));
        apply(&mut state, decision("web-2", &["west"]));
        assert_eq!(events(&mut state), ["+east", "+west"]);
        delete(&mut state, decision("web-1", &[]));
        assert_eq!(events(&mut state), ["-east"]);
        delete(&mut state, decision("web-2", &[]));
        assert_eq!(events(&mut state), ["-west"]);
    }

    #[tokio::test]
    async fn a_decision_gone_from_a_relist_is_taken_as_deleted() {
        let (mut state, _) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        apply(&mut state, decision("web-1", &["east"]));
        assert_eq!(events(&mut state), ["+east"]);
        state.on_decisions(0, Ok(watcher::Event::Init));
        assert!(events(&mut state).is_empty(), "kept while relisting");
        state.on_decisions(0, Ok(watcher::Event::InitDone));
        assert_eq!(events(&mut state), ["-east"]);
    }

    #[tokio::test]
    async fn inner_events_of_named_clusters_pass_through_in_order() {
        let (mut state, _) = state(vec![Decisions::placement("fleet", "web")]);
        apply(&mut state, decision("web-1", &["east"]));
        state.on_inner(engage("east"));
        state.on_inner(engage("east"));
        state.on_inner(disengage("east"));
        state.on_inner(disengage("west"));
        assert_eq!(events(&mut state), ["+east", "+east", "-east"]);
        // Disengaged by the inner provider: not engaged again by a decision.
        apply(&mut state, decision("web-1", &["east", "west"]));
        apply(&mut state, decision("web-1", &["east"]));
        assert!(events(&mut state).is_empty());
        state.on_inner(engage("east"));
        assert_eq!(events(&mut state), ["+east"]);
    }

    #[tokio::test]
    async fn an_unknown_cluster_is_a_problem_of_its_decision_until_offered() {
        let (mut state, problems) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        apply(&mut state, decision("web-1", &["east", "south"]));
        assert_eq!(events(&mut state), ["+east"]);
        let source = "PlacementDecision fleet/web-1, cluster \"south\"";
        assert_eq!(sources(&problems), [source]);
        assert!(
            problems
                .get(source)
                .unwrap()
                .contains("no cluster \"south\"")
        );
        state.on_inner(engage("south"));
        assert_eq!(events(&mut state), ["+south"]);
        assert!(problems.current().is_empty());
        // Disengaged by the inner provider, it is unknown again.
        state.on_inner(disengage("south"));
        assert_eq!(events(&mut state), ["-south"]);
        assert_eq!(sources(&problems), [source]);
        // No longer named: no longer a problem.
        apply(&mut state, decision("web-1", &["east"]));
        assert!(problems.current().is_empty());
        assert!(events(&mut state).is_empty());
    }

    #[tokio::test]
    async fn a_malformed_decision_is_a_problem_and_the_others_still_count() {
        let (mut state, problems) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        state.on_inner(engage("west"));
        apply(&mut state, decision("web-1", &["east"]));
        let mut bad = decision("web-2", &[]);
        bad.data = serde_json::json!({ "status": { "decisions": [{ "clusterName": 1 }, { "clusterName": "west" }] } });
        apply(&mut state, bad.clone());
        assert_eq!(events(&mut state), ["+east", "+west"]);
        assert_eq!(
            problems.get("PlacementDecision fleet/web-2").as_deref(),
            Some("status.decisions[0].clusterName is not a string")
        );
        bad.data = serde_json::json!({ "status": { "decisions": "west" } });
        apply(&mut state, bad.clone());
        assert_eq!(events(&mut state), ["-west"]);
        assert_eq!(
            problems.get("PlacementDecision fleet/web-2").as_deref(),
            Some("status.decisions is not a list")
        );
        delete(&mut state, bad);
        assert!(problems.current().is_empty());
    }

    #[tokio::test]
    async fn decision_names_map_onto_the_inner_providers_names() {
        let source = Decisions::placement("fleet", "web")
            .cluster_names(|name| ClusterName::new(format!("prod#{name}")));
        let (mut state, problems) = state(vec![source]);
        state.on_inner(engage("prod#east"));
        state.on_inner(engage("east"));
        apply(&mut state, decision("web-1", &["east", "west"]));
        assert_eq!(events(&mut state), ["+prod#east"]);
        assert_eq!(
            sources(&problems),
            ["PlacementDecision fleet/web-1, cluster \"west\""]
        );
        assert!(
            problems
                .current()
                .values()
                .next()
                .unwrap()
                .contains("\"prod#west\"")
        );
    }

    #[tokio::test]
    async fn a_decision_being_deleted_names_nothing() {
        let (mut state, _) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        apply(&mut state, decision("web-1", &["east"]));
        assert_eq!(events(&mut state), ["+east"]);
        let mut deleting = decision("web-1", &["east"]);
        deleting.metadata = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Default::default(),
            )),
            ..deleting.metadata
        };
        apply(&mut state, deleting);
        assert_eq!(events(&mut state), ["-east"]);
    }

    #[tokio::test]
    async fn a_failing_watch_keeps_the_clusters_and_is_a_problem_until_it_passes() {
        let (mut state, problems) = state(vec![Decisions::placement("fleet", "web")]);
        state.on_inner(engage("east"));
        apply(&mut state, decision("web-1", &["east"]));
        assert_eq!(events(&mut state), ["+east"]);
        state.on_decisions(0, Err(watcher::Error::NoResourceVersion));
        assert!(events(&mut state).is_empty());
        let source = "PlacementDecisions (cluster.open-cluster-management.io/v1beta1) in fleet \
                      labelled cluster.open-cluster-management.io/placement=web";
        assert_eq!(sources(&problems), [source]);
        // Init comes before each list, which may fail again: the watch
        // works only once the list brings something.
        state.on_decisions(0, Ok(watcher::Event::Init));
        assert_eq!(sources(&problems), [source]);
        let listed = decision("web-1", &["east"]);
        state.on_decisions(0, Ok(watcher::Event::InitApply(listed)));
        assert!(problems.current().is_empty());
        state.on_decisions(0, Ok(watcher::Event::InitDone));
        assert!(events(&mut state).is_empty());
    }

    #[tokio::test]
    async fn a_watch_whose_list_keeps_failing_stays_a_problem() {
        let problems = Problems::new();
        let mut state = State::new(
            vec![Decisions::placement("fleet", "web")],
            problems.clone(),
            Duration::ZERO,
        );
        for _ in 0..3 {
            state.on_decisions(0, Ok(watcher::Event::Init));
            state.on_decisions(0, Err(watcher::Error::NoResourceVersion));
            assert_eq!(problems.current().len(), 1);
            state.on_decisions(0, Ok(watcher::Event::Init));
            assert_eq!(problems.current().len(), 1, "not cleared by Init");
        }
    }

    #[tokio::test]
    async fn a_cluster_moving_to_another_decision_within_the_grace_stays_engaged() {
        let grace = Duration::from_secs(2);
        let (mut state, _) = state_with_grace(vec![Decisions::placement("fleet", "web")], grace);
        state.on_inner(engage("east"));
        state.on_inner(engage("west"));
        apply(&mut state, decision("web-1", &["east", "west"]));
        assert_eq!(events(&mut state), ["+east", "+west"]);

        // From one page to the next: taken off one, then named by the other.
        apply(&mut state, decision("web-1", &["east"]));
        assert!(events(&mut state).is_empty());
        let deadline = state.deadline().expect("west in its grace");
        apply(&mut state, decision("web-2", &["west"]));
        assert_eq!(state.deadline(), None);
        state.on_deadline(deadline + grace);
        assert!(events(&mut state).is_empty());

        // Taken off for longer than the grace: disengaged once it ends.
        apply(&mut state, decision("web-2", &[]));
        let deadline = state.deadline().expect("west in its grace");
        assert!(deadline <= Instant::now() + grace);
        state.on_deadline(deadline - Duration::from_millis(1));
        assert!(events(&mut state).is_empty());
        state.on_deadline(deadline);
        assert_eq!(events(&mut state), ["-west"]);
        assert_eq!(state.deadline(), None);
        // Named again: engaged again.
        apply(&mut state, decision("web-1", &["east", "west"]));
        assert_eq!(events(&mut state), ["+west"]);
    }

    #[tokio::test]
    async fn the_inner_providers_events_pass_at_once_during_the_grace() {
        let grace = Duration::from_secs(2);
        let (mut state, _) = state_with_grace(vec![Decisions::placement("fleet", "web")], grace);
        state.on_inner(engage("east"));
        state.on_inner(engage("west"));
        apply(&mut state, decision("web-1", &["east", "west"]));
        assert_eq!(events(&mut state), ["+east", "+west"]);
        apply(&mut state, decision("web-1", &[]));
        assert!(events(&mut state).is_empty());
        // Still engaged: a new engagement replaces the one the fleet holds.
        state.on_inner(engage("east"));
        assert_eq!(events(&mut state), ["+east"]);
        state.on_inner(disengage("west"));
        assert_eq!(events(&mut state), ["-west"]);
        let deadline = state.deadline().expect("east in its grace");
        state.on_deadline(deadline);
        assert_eq!(events(&mut state), ["-east"]);
        assert_eq!(state.deadline(), None);
    }
}
