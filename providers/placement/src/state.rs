//! What the inner provider offers, what the decisions name, and the events
//! that keep the fleet at the clusters that are both.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use kube::{api::DynamicObject, runtime::watcher};
use kube_multicluster::{
    ClusterName,
    provider::{ClusterEvent, Problems, Seen, SourceChange},
};

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
    ready: VecDeque<ClusterEvent>,
}

impl State {
    pub(crate) fn new(sources: Vec<Decisions>, problems: Problems) -> Self {
        Self {
            seen: sources.iter().map(|_| Seen::new()).collect(),
            sources,
            problems,
            offered: HashMap::new(),
            decisions: HashMap::new(),
            named: HashMap::new(),
            engaged: HashSet::new(),
            ready: VecDeque::new(),
        }
    }

    /// The next event for the fleet, if any.
    pub(crate) fn next_event(&mut self) -> Option<ClusterEvent> {
        self.ready.pop_front()
    }

    /// The inner provider's `event`: remembered, and handed on if its
    /// cluster is named.
    pub(crate) fn on_inner(&mut self, event: ClusterEvent) {
        match &event {
            ClusterEvent::Engage { name, .. } | ClusterEvent::EngageView { name, .. } => {
                let name = name.clone();
                if self.is_named(&name) {
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
        self.problems
            .watch(&self.sources[index].watch_source(), event.as_ref().err());
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
                    }
                }
                self.update(name);
            }
        }
        for (name, written) in &decision.names {
            if before.as_ref().is_none_or(|b| !b.contains_key(name)) {
                *self.named.entry(name.clone()).or_default() += 1;
                self.update(name);
            }
            if !self.offered.contains_key(name) {
                self.problems
                    .report(decision.cluster_source(written), unknown(name));
            }
        }
        self.decisions.insert(key, decision);
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
    /// disengages it if it is engaged and no longer both.
    fn update(&mut self, name: &ClusterName) {
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

    fn state(sources: Vec<Decisions>) -> (State, Problems) {
        let problems = Problems::new();
        let mut state = State::new(sources, problems.clone());
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
        state.on_decisions(0, Ok(watcher::Event::Init));
        assert!(problems.current().is_empty());
    }
}
