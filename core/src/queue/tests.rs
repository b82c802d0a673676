use std::{collections::HashMap, future::poll_fn, task::Poll, time::Duration};

use super::*;
use crate::action::Action;
use keys::Phase;

fn key(cluster: &str, name: &str) -> McRequest {
    McRequest::new(cluster, Some("default"), name)
}

/// A queue with these limits and a backoff without jitter.
fn queue_with(limits: Limits) -> Queue {
    let backoff = Backoff {
        jitter: 0.0,
        ..Backoff::default()
    };
    Queue::new(backoff, limits)
}

fn queue() -> Queue {
    queue_with(Limits::default())
}

/// The next key to run, waiting (in paused time) as long as it takes.
async fn next(queue: &mut Queue) -> McRequest {
    poll_fn(|cx| queue.poll_pop_ready(cx).map(|ready| ready.pop().0)).await
}

/// The key ready right now, if any.
fn ready_now(queue: &mut Queue) -> Option<McRequest> {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    match queue.poll_pop_ready(&mut cx) {
        Poll::Ready(ready) => Some(ready.pop().0),
        Poll::Pending => None,
    }
}

/// Every key ready right now, each completed at once with success.
fn run_all_now(queue: &mut Queue) -> Vec<McRequest> {
    let mut ran = Vec::new();
    while let Some(k) = ready_now(queue) {
        queue.complete(&k, success());
        ran.push(k);
    }
    ran
}

/// Every key ready right now, left running.
fn start_all_now(queue: &mut Queue) -> Vec<McRequest> {
    std::iter::from_fn(|| ready_now(queue)).collect()
}

fn success() -> Outcome {
    Outcome::Success(Action::await_change())
}

fn push(queue: &mut Queue, k: McRequest) {
    queue.push(k, Lane::Changed, ReconcileReason::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_key_already_queued_is_queued_once() {
    let mut queue = queue();
    push(&mut queue, key("a", "x"));
    push(&mut queue, key("a", "x"));
    queue.push(key("a", "x"), Lane::Listed, ReconcileReason::Unknown);
    queue.schedule(
        key("a", "x"),
        Instant::now() + Duration::from_secs(5),
        Lane::Changed,
        ReconcileReason::Unknown,
    );
    assert_eq!(queue.waiting(), 1);
    assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
    assert_eq!(ready_now(&mut queue), None);
}

#[tokio::test(start_paused = true)]
async fn a_running_key_is_not_handed_out_again_but_reruns_once_after() {
    let mut queue = queue();
    push(&mut queue, key("a", "x"));
    let running = ready_now(&mut queue).unwrap();
    // Changes arrive while it runs: not handed out in parallel.
    push(&mut queue, key("a", "x"));
    push(&mut queue, key("a", "x"));
    assert_eq!(ready_now(&mut queue), None);
    queue.complete(&running, success());
    // Exactly one more run.
    assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
    queue.complete(&key("a", "x"), success());
    assert_eq!(ready_now(&mut queue), None);
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn requeue_after_runs_the_key_again_after_the_delay() {
    let mut queue = queue();
    push(&mut queue, key("a", "x"));
    let k = ready_now(&mut queue).unwrap();
    let done = Instant::now();
    queue.complete(
        &k,
        Outcome::Success(Action::requeue(Duration::from_secs(30))),
    );
    assert_eq!(ready_now(&mut queue), None);
    assert_eq!(next(&mut queue).await, k);
    assert_eq!(done.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_change_runs_a_delayed_key_sooner() {
    let mut queue = queue();
    queue.schedule(
        key("a", "x"),
        Instant::now() + Duration::from_secs(60),
        Lane::Changed,
        ReconcileReason::Unknown,
    );
    assert_eq!(ready_now(&mut queue), None);
    push(&mut queue, key("a", "x"));
    assert_eq!(ready_now(&mut queue), Some(key("a", "x")));
    queue.complete(&key("a", "x"), success());
    // The old delay is gone with it.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(ready_now(&mut queue), None);
    assert!(queue.lanes.is_empty(), "nothing left of cluster a");
}

/// The next key and its reason, right now.
fn reason_now(queue: &mut Queue) -> Option<(McRequest, ReconcileReason)> {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    match queue.poll_pop_ready(&mut cx) {
        Poll::Ready(ready) => Some(ready.pop()),
        Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn each_run_carries_the_first_reason_or_the_one_that_made_it_sooner() {
    use ReconcileReason::*;
    let mut queue = queue();
    let x = key("a", "x");
    // Merged while waiting: the first reason stays.
    queue.push(x.clone(), Lane::Listed, Listed);
    queue.push(x.clone(), Lane::Listed, External);
    assert_eq!(reason_now(&mut queue), Some((x.clone(), Listed)));
    // A requeue asked for; then a change runs it sooner, as a change.
    queue.complete(
        &x,
        Outcome::Success(Action::requeue(Duration::from_secs(60))),
    );
    queue.push(x.clone(), Lane::Changed, ObjectUpdated);
    assert_eq!(reason_now(&mut queue), Some((x.clone(), ObjectUpdated)));
    queue.complete(
        &x,
        Outcome::Success(Action::requeue(Duration::from_secs(60))),
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        reason_now(&mut queue),
        Some((x.clone(), ReconcilerRequestedRetry))
    );
    // A failure retries as such, unless a change came while it ran.
    queue.complete(&x, Outcome::Failure(None));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        reason_now(&mut queue),
        Some((x.clone(), ErrorPolicyRequestedRetry))
    );
    let related = RelatedObjectUpdated {
        kind: "Secret".into(),
    };
    queue.push(x.clone(), Lane::Changed, related.clone());
    queue.complete(&x, Outcome::Failure(None));
    assert_eq!(reason_now(&mut queue), Some((x.clone(), related)));
    queue.complete(&x, Outcome::Interrupted);
    assert_eq!(reason_now(&mut queue), Some((x, ClusterReplaced)));
}

#[tokio::test(start_paused = true)]
async fn a_failing_key_backs_off_exponentially_and_success_resets_it() {
    let mut queue = queue();
    push(&mut queue, key("a", "x"));
    let mut delays = Vec::new();
    let mut k = ready_now(&mut queue).unwrap();
    for _ in 0..5 {
        queue.complete(&k, Outcome::Failure(None));
        let failed = Instant::now();
        k = next(&mut queue).await;
        delays.push(failed.elapsed());
    }
    let ms = Duration::from_millis;
    assert_eq!(delays, [ms(5), ms(10), ms(20), ms(40), ms(80)]);
    assert_eq!(queue.failures(&k), 5);

    queue.complete(&k, success());
    assert_eq!(queue.failures(&k), 0);
    push(&mut queue, k.clone());
    let k = ready_now(&mut queue).unwrap();
    queue.complete(&k, Outcome::Failure(None));
    let failed = Instant::now();
    next(&mut queue).await;
    assert_eq!(
        failed.elapsed(),
        ms(5),
        "backoff starts over after a success"
    );
}

#[tokio::test(start_paused = true)]
async fn keys_failing_together_retry_spread_out_by_jitter() {
    let backoff = Backoff {
        base: Duration::from_millis(100),
        ..Backoff::default()
    };
    let mut queue = Queue::new(backoff, Limits::default());
    for i in 0..100 {
        push(&mut queue, key("a", &i.to_string()));
    }
    for k in start_all_now(&mut queue) {
        queue.complete(&k, Outcome::Failure(None));
    }
    let failed = Instant::now();
    let mut retried_at = Vec::new();
    for _ in 0..100 {
        let k = next(&mut queue).await;
        retried_at.push(failed.elapsed());
        queue.complete(&k, success());
    }
    // 10% jitter on 100 ms; the timer counts whole milliseconds.
    let (first, last) = (retried_at[0], retried_at[99]);
    assert!(first >= Duration::from_millis(100), "{first:?}");
    assert!(last <= Duration::from_millis(111), "{last:?}");
    retried_at.dedup();
    assert!(retried_at.len() >= 5, "not in lockstep: {retried_at:?}");
}

#[tokio::test(start_paused = true)]
async fn backoff_is_per_key() {
    let mut queue = queue();
    push(&mut queue, key("a", "bad"));
    let bad = ready_now(&mut queue).unwrap();
    for _ in 0..10 {
        queue.complete(&bad, Outcome::Failure(None));
        next(&mut queue).await;
    }
    push(&mut queue, key("a", "good"));
    let good = ready_now(&mut queue).unwrap();
    queue.complete(&good, Outcome::Failure(None));
    let failed = Instant::now();
    assert_eq!(next(&mut queue).await, good);
    assert_eq!(failed.elapsed(), Duration::from_millis(5));
    assert_eq!(queue.failures(&bad), 10);
}

#[tokio::test(start_paused = true)]
async fn a_busy_cluster_cannot_starve_another() {
    let mut queue = queue();
    for i in 0..100_000 {
        push(&mut queue, key("busy", &format!("obj-{i}")));
    }
    push(&mut queue, key("quiet", "only"));
    let first_two = [
        ready_now(&mut queue).unwrap(),
        ready_now(&mut queue).unwrap(),
    ];
    assert!(
        first_two.contains(&key("quiet", "only")),
        "the quiet cluster's key runs within one turn: {first_two:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_runs_ahead_of_the_listed_backlog_and_the_backlog_still_moves() {
    let mut queue = queue();
    for i in 0..10_000 {
        queue.push(
            key("a", &format!("listed-{i}")),
            Lane::Listed,
            ReconcileReason::Unknown,
        );
    }
    let first = ready_now(&mut queue).unwrap();
    assert_eq!(first.name, "listed-0");
    push(&mut queue, key("a", "edited"));
    queue.complete(&first, success());
    assert_eq!(
        ready_now(&mut queue).unwrap().name,
        "edited",
        "a fresh change waits behind one backlog key at most"
    );
    queue.complete(&key("a", "edited"), success());
    // With changes arriving all the time, the backlog keeps every other turn.
    let mut order = Vec::new();
    for i in 0..10 {
        push(&mut queue, key("a", &format!("change-{i}")));
        let k = ready_now(&mut queue).unwrap();
        order.push(k.name.clone());
        queue.complete(&k, success());
    }
    let listed = order.iter().filter(|n| n.starts_with("listed-")).count();
    assert_eq!(listed, 5, "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_listed_key_that_changes_moves_to_the_front_lane_and_runs_once() {
    let mut queue = queue();
    for i in 0..100 {
        queue.push(
            key("a", &format!("listed-{i}")),
            Lane::Listed,
            ReconcileReason::Unknown,
        );
    }
    let first = ready_now(&mut queue).unwrap();
    queue.complete(&first, success());
    // listed-50 changes while it waits in the backlog.
    push(&mut queue, key("a", "listed-50"));
    assert_eq!(queue.waiting(), 99, "still one key");
    assert_eq!(ready_now(&mut queue).unwrap().name, "listed-50");
    queue.complete(&key("a", "listed-50"), success());
    let rest = run_all_now(&mut queue);
    assert_eq!(rest.len(), 98);
    assert!(!rest.contains(&key("a", "listed-50")), "ran once only");
    assert_eq!(queue.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn turns_alternate_between_clusters() {
    let mut queue = queue();
    for name in ["1", "2", "3"] {
        push(&mut queue, key("a", name));
        push(&mut queue, key("b", name));
    }
    let clusters: Vec<String> = std::iter::from_fn(|| ready_now(&mut queue))
        .map(|k| k.cluster.to_string())
        .collect();
    assert_eq!(clusters, ["a", "b", "a", "b", "a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn in_turn_a_cluster_runs_the_keys_it_had_ready_before_the_next_cluster() {
    let mut queue = queue_with(Limits {
        concurrency: Some(100),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for name in ["1", "2", "3"] {
        push(&mut queue, key("a", name));
        push(&mut queue, key("b", name));
    }
    let first = ready_now(&mut queue).unwrap();
    assert_eq!(first, key("a", "1"));
    // Keys that become ready during a's turn wait for its next one.
    push(&mut queue, key("a", "4"));
    let rest: Vec<String> = std::iter::from_fn(|| ready_now(&mut queue))
        .map(|k| format!("{}/{}", k.cluster, k.name))
        .collect();
    assert_eq!(rest, ["a/2", "a/3", "b/1", "b/2", "b/3", "a/4"]);
}

#[tokio::test(start_paused = true)]
async fn in_turn_one_cluster_may_take_every_slot_and_the_next_follows() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for cluster in ["a", "b"] {
        for i in 0..20 {
            push(&mut queue, key(cluster, &i.to_string()));
        }
    }
    let running = start_all_now(&mut queue);
    assert_eq!(running.len(), 16);
    assert!(running.iter().all(|k| k.cluster == "a"), "{running:?}");
    // As a's reconciles end, its last four start, then b's.
    for k in &running[..8] {
        queue.complete(k, success());
    }
    let next: Vec<String> = start_all_now(&mut queue)
        .iter()
        .map(|k| k.cluster.to_string())
        .collect();
    assert_eq!(next, ["a", "a", "a", "a", "b", "b", "b", "b"]);
    // An explicit cluster limit still caps it, and the others run beside.
    let mut capped = queue_with(Limits {
        concurrency: Some(16),
        cluster_concurrency: Some(4),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    let counts = admitted(&mut capped, &["a", "b", "c", "d", "e"]);
    assert_eq!(counts.values().sum::<usize>(), 16, "{counts:?}");
    assert!(counts.values().all(|n| *n <= 4), "{counts:?}");
}

#[tokio::test(start_paused = true)]
async fn in_turn_without_a_total_limit_is_fair() {
    let mut queue = queue_with(Limits {
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for name in ["1", "2"] {
        push(&mut queue, key("a", name));
        push(&mut queue, key("b", name));
    }
    let clusters: Vec<String> = std::iter::from_fn(|| ready_now(&mut queue))
        .map(|k| k.cluster.to_string())
        .collect();
    assert_eq!(clusters, ["a", "b", "a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn in_turn_a_turn_runs_at_most_eight_waves_of_the_slots() {
    let mut queue = queue_with(Limits {
        concurrency: Some(1),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for i in 0..100 {
        push(&mut queue, key("a", &i.to_string()));
    }
    push(&mut queue, key("b", "0"));
    let order: Vec<String> = run_all_now(&mut queue)
        .iter()
        .map(|k| k.cluster.to_string())
        .collect();
    // Eight waves of one slot is 8, raised to the floor of 64.
    assert!(order[..64].iter().all(|c| c == "a"), "{order:?}");
    assert_eq!(order[64], "b");
    assert_eq!(order.len(), 101);
}

/// In turn, one slot: five keys of `a`, one of `b`, and `a`'s first key
/// started.
fn in_turn_of_a_started() -> (Queue, McRequest) {
    let mut queue = queue_with(Limits {
        concurrency: Some(1),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for i in 0..5 {
        push(&mut queue, key("a", &i.to_string()));
    }
    push(&mut queue, key("b", "0"));
    let first = ready_now(&mut queue).unwrap();
    assert_eq!(first.cluster, "a");
    (queue, first)
}

#[tokio::test(start_paused = true)]
async fn in_turn_a_cluster_that_does_not_answer_gives_its_turn_up() {
    let (mut queue, first) = in_turn_of_a_started();
    queue.complete(&first, Outcome::Unanswered);
    assert_eq!(ready_now(&mut queue).unwrap(), key("b", "0"));
}

#[tokio::test(start_paused = true)]
async fn in_turn_a_run_that_waited_through_an_outage_that_is_over_keeps_the_turn() {
    let (mut queue, first) = in_turn_of_a_started();
    queue.answering(&"a".into());
    queue.complete(&first, Outcome::Unanswered);
    assert_eq!(ready_now(&mut queue).unwrap().cluster, "a");
}

#[tokio::test(start_paused = true)]
async fn in_turn_a_cluster_that_does_not_answer_runs_no_more_than_its_fair_share() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        sharing: Sharing::InTurn,
        ..Limits::default()
    });
    for i in 0..40 {
        push(&mut queue, key("dead", &i.to_string()));
        push(&mut queue, key("live", &i.to_string()));
    }
    let first = start_all_now(&mut queue);
    assert!(first.iter().all(|k| k.cluster == "dead"), "{first:?}");
    // Its runs fail for want of an answer; their keys wait to retry.
    for k in &first {
        queue.complete(k, Outcome::Unanswered);
    }
    let next = start_all_now(&mut queue);
    let dead = next.iter().filter(|k| k.cluster == "dead").count();
    assert_eq!(next.len(), 16);
    assert!(dead <= 8, "{dead} of the dead cluster's keys run at once");
}

#[tokio::test(start_paused = true)]
async fn a_drained_backlog_gives_its_memory_back() {
    let mut queue = queue();
    for i in 0..20_000 {
        queue.push(
            key("a", &i.to_string()),
            Lane::Listed,
            ReconcileReason::Unknown,
        );
    }
    let full = queue.keys.capacity();
    assert!(full >= 20_000);
    assert_eq!(run_all_now(&mut queue).len(), 20_000);
    assert!(
        queue.keys.capacity() <= 1024 * 2,
        "{} of {full}",
        queue.keys.capacity()
    );
    // And a purge of a cluster's backlog too.
    for i in 0..20_000 {
        push(&mut queue, key("b", &i.to_string()));
    }
    queue.purge(&"b".into());
    assert!(
        queue.keys.capacity() <= 1024 * 2,
        "{}",
        queue.keys.capacity()
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_cluster_keeps_its_keys_queued_and_counted_until_released() {
    let mut queue = queue();
    queue.hold(&"syncing".into());
    push(&mut queue, key("syncing", "x"));
    push(&mut queue, key("ready", "y"));
    assert_eq!(run_all_now(&mut queue), [key("ready", "y")]);
    push(&mut queue, key("syncing", "x"));
    assert_eq!(queue.waiting(), 1, "held keys count and stay deduplicated");
    queue.release(&"syncing".into());
    assert_eq!(run_all_now(&mut queue), [key("syncing", "x")]);
}

#[tokio::test(start_paused = true)]
async fn the_controller_limit_caps_reconciles_in_flight() {
    let mut queue = queue_with(Limits {
        concurrency: Some(2),
        ..Limits::default()
    });
    for i in 0..5 {
        push(&mut queue, key("a", &i.to_string()));
    }
    let running = start_all_now(&mut queue);
    assert_eq!(running.len(), 2);
    queue.complete(&running[0], success());
    assert_eq!(start_all_now(&mut queue).len(), 1);
}

/// Fills `clusters` with keys and starts every key the queue admits,
/// completing none: how many each cluster got.
fn admitted(queue: &mut Queue, clusters: &[&str]) -> HashMap<String, usize> {
    for cluster in clusters {
        for i in 0..100 {
            push(queue, key(cluster, &i.to_string()));
        }
    }
    let mut counts = HashMap::new();
    for k in start_all_now(queue) {
        *counts.entry(k.cluster.to_string()).or_default() += 1;
    }
    counts
}

#[tokio::test(start_paused = true)]
async fn a_lone_cluster_may_use_every_slot() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        ..Limits::default()
    });
    assert_eq!(admitted(&mut queue, &["only"])["only"], 16);
}

#[tokio::test(start_paused = true)]
async fn one_cluster_never_holds_more_than_half_the_slots_once_there_are_others() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        ..Limits::default()
    });
    queue.hold(&"idle".into());
    queue.release(&"idle".into());
    // Only "hung" has work, and its reconciles never end.
    assert_eq!(admitted(&mut queue, &["hung"])["hung"], 8);
    // The others still find half the slots free.
    let later = admitted(&mut queue, &["b", "c"]);
    assert_eq!(later.values().sum::<usize>(), 8, "{later:?}");
}

#[tokio::test(start_paused = true)]
async fn clusters_with_work_share_the_slots_fairly() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        ..Limits::default()
    });
    let counts = admitted(&mut queue, &["a", "b", "c", "d"]);
    assert!(counts.values().all(|n| *n == 4), "{counts:?}");
}

#[tokio::test(start_paused = true)]
async fn an_explicit_cluster_limit_wins_over_the_fair_share() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        cluster_concurrency: Some(3),
        ..Limits::default()
    });
    let counts = admitted(&mut queue, &["a", "b"]);
    assert_eq!((counts["a"], counts["b"]), (3, 3));
}

#[tokio::test(start_paused = true)]
async fn by_default_each_cluster_has_slots_of_its_own() {
    let mut queue = queue_with(Limits {
        default_cluster_concurrency: Some(4),
        ..Limits::default()
    });
    // The first cluster fills its slots and never finishes them...
    let first = admitted(&mut queue, &["first"]);
    assert_eq!(first["first"], 4);
    // ...and the others that come later still get all of theirs.
    let later = admitted(&mut queue, &["second", "third"]);
    assert_eq!((later["second"], later["third"]), (4, 4), "{later:?}");
}

#[tokio::test(start_paused = true)]
async fn a_controller_limit_replaces_the_default_cluster_slots_with_the_fair_share() {
    let mut queue = queue_with(Limits {
        concurrency: Some(16),
        default_cluster_concurrency: Some(4),
        ..Limits::default()
    });
    let counts = admitted(&mut queue, &["a", "b"]);
    assert_eq!((counts["a"], counts["b"]), (8, 8));
}

#[tokio::test(start_paused = true)]
async fn a_throttled_cluster_keeps_its_keys_deduplicated_and_holds_no_other_back() {
    let mut queue = queue_with(Limits {
        cluster_rate_limit: Some((1.0, 1)),
        ..Limits::default()
    });
    push(&mut queue, key("slow", "first"));
    push(&mut queue, key("slow", "x"));
    let ran = run_all_now(&mut queue);
    assert_eq!(ran, [key("slow", "first")]);
    // "x" waits for slow's next token; it changes twice meanwhile.
    push(&mut queue, key("slow", "x"));
    push(&mut queue, key("slow", "x"));
    assert_eq!(queue.waiting(), 1, "throttled keys are counted once");
    push(&mut queue, key("other", "z"));
    assert_eq!(run_all_now(&mut queue), [key("other", "z")]);
    let waited = Instant::now();
    assert_eq!(next(&mut queue).await, key("slow", "x"));
    assert_eq!(waited.elapsed(), Duration::from_secs(1));
    queue.complete(&key("slow", "x"), success());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(run_all_now(&mut queue), [], "x ran once");
}

#[tokio::test(start_paused = true)]
async fn a_cluster_keeps_its_bucket_between_keys_even_when_it_has_none_queued() {
    let mut queue = queue_with(Limits {
        cluster_rate_limit: Some((1.0, 1)),
        ..Limits::default()
    });
    // A cluster the controller does not serve: a mapper's target, say.
    let mut ran = 0;
    for i in 0..10 {
        push(&mut queue, key("member", &i.to_string()));
        ran += run_all_now(&mut queue).len();
    }
    assert_eq!(ran, 1, "one token, one run, however idle in between");
}

#[tokio::test(start_paused = true)]
async fn a_shared_bucket_serves_clusters_in_turn_not_in_arrival_order() {
    let mut queue = queue_with(Limits {
        rate_limit: Some(TokenBucket::new(10.0, 1)),
        ..Limits::default()
    });
    for i in 0..10_000 {
        queue.push(
            key("relisting", &i.to_string()),
            Lane::Listed,
            ReconcileReason::Unknown,
        );
    }
    let first = ready_now(&mut queue).unwrap();
    queue.complete(&first, success());
    push(&mut queue, key("quiet", "edited"));
    let started = Instant::now();
    let mut k = next(&mut queue).await;
    queue.complete(&k, success());
    if k.cluster != "quiet" {
        k = next(&mut queue).await;
    }
    assert_eq!(k, key("quiet", "edited"));
    assert!(started.elapsed() <= Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn keys_that_failed_for_want_of_an_answer_run_once_their_cluster_answers() {
    let mut queue = queue_with(Limits {
        cluster_concurrency: Some(1),
        ..Limits::default()
    });
    for name in ["down-1", "down-2", "own-error", "requeued"] {
        push(&mut queue, key("east", name));
    }
    push(&mut queue, key("west", "down"));
    // Each fails again and again, so that its backoff grows long; the
    // last time, one succeeds and asks to run in an hour instead.
    for round in 0..12 {
        while let Some(k) = ready_now(&mut queue) {
            let outcome = match k.name.as_str() {
                "own-error" => Outcome::Failure(None),
                "requeued" if round == 11 => {
                    Outcome::Success(Action::requeue(Duration::from_secs(3600)))
                }
                _ => Outcome::Unanswered,
            };
            queue.complete(&k, outcome);
        }
        tokio::time::advance(Duration::from_secs(30)).await;
    }
    while let Some(k) = ready_now(&mut queue) {
        let own = k.name == "own-error";
        queue.complete(
            &k,
            if own {
                Outcome::Failure(None)
            } else {
                Outcome::Unanswered
            },
        );
    }
    assert!(queue.failures(&key("east", "down-1")) >= 12);
    assert_eq!(ready_now(&mut queue), None, "all wait");

    // Only east's keys that failed for want of an answer run now, one
    // at a time as east's limit says.
    assert_eq!(queue.answering(&"east".into()), 2);
    let mut ran = Vec::new();
    while let Some(k) = ready_now(&mut queue) {
        assert_eq!(ready_now(&mut queue), None, "the cluster's limit holds");
        queue.complete(&k, success());
        ran.push(k.name);
    }
    ran.sort();
    assert_eq!(ran, ["down-1", "down-2"]);
    assert_eq!(queue.failures(&key("east", "down-1")), 0);
    // Told again, nothing is left to hurry; west is told of its own.
    assert_eq!(queue.answering(&"east".into()), 0);
    assert_eq!(queue.answering(&"west".into()), 1);
    assert_eq!(ready_now(&mut queue), Some(key("west", "down")));
}

#[tokio::test(start_paused = true)]
async fn a_key_running_when_its_cluster_answers_again_does_not_wait_out_its_backoff() {
    let mut queue = queue();
    push(&mut queue, key("east", "slow"));
    push(&mut queue, key("east", "later"));
    let slow = ready_now(&mut queue).unwrap();
    let later = ready_now(&mut queue).unwrap();
    // The cluster answers again while both wait on a request to it.
    queue.answering(&"east".into());
    queue.complete(&slow, Outcome::Unanswered);
    assert_eq!(
        ready_now(&mut queue),
        Some(slow.clone()),
        "it runs again at once"
    );
    queue.complete(&slow, success());
    assert_eq!(ready_now(&mut queue), None);
    // So does the other; but a run that started after the cluster
    // answered and fails for want of an answer backs off.
    queue.complete(&later, Outcome::Unanswered);
    let retried = ready_now(&mut queue).unwrap();
    assert_eq!(retried, later);
    queue.complete(&retried, Outcome::Unanswered);
    assert_eq!(ready_now(&mut queue), None, "a new failure backs off");
}

#[tokio::test(start_paused = true)]
async fn purging_a_cluster_forgets_its_waiting_running_and_delayed_keys() {
    let mut queue = queue_with(Limits {
        cluster_rate_limit: Some((100.0, 100)),
        ..Limits::default()
    });
    queue.hold(&"gone".into());
    queue.release(&"gone".into());
    push(&mut queue, key("gone", "ready"));
    push(&mut queue, key("gone", "running"));
    queue.schedule(
        key("gone", "later"),
        Instant::now() + Duration::from_secs(10),
        Lane::Changed,
        ReconcileReason::Unknown,
    );
    push(&mut queue, key("stays", "x"));
    // Serve "gone" first, then take its second key too.
    let mut running = None;
    while running.is_none() {
        let k = ready_now(&mut queue).unwrap();
        if k.cluster == "gone" && k.name == "running" {
            running = Some(k);
        } else if k.cluster == "gone" {
            push(&mut queue, k.clone());
            queue.complete(&k, success());
        } else {
            queue.complete(&k, success());
            push(&mut queue, k);
        }
    }
    queue.purge(&"gone".into());
    assert!(
        !queue.lanes.knows("gone"),
        "its lanes, counts and bucket are gone"
    );
    // A run that was cancelled or finishes late schedules nothing.
    queue.complete(&running.unwrap(), Outcome::Failure(None));
    tokio::time::advance(Duration::from_secs(20)).await;
    let left = run_all_now(&mut queue);
    assert_eq!(left, [key("stays", "x")]);
    assert_eq!(queue.waiting(), 0);
    assert!(queue.keys.is_empty());
    let kept: Vec<_> = queue
        .lanes
        .known()
        .into_iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(kept, ["stays"], "only the bucket of the cluster that stays");
    assert_eq!(queue.lanes.counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn huge_requeue_delays_are_clamped_instead_of_panicking() {
    let mut queue = queue();
    push(&mut queue, key("a", "x"));
    let k = ready_now(&mut queue).unwrap();
    queue.complete(
        &k,
        Outcome::Success(Action::requeue(Duration::from_secs(u64::MAX / 4))),
    );
    queue.schedule(
        key("a", "y"),
        Instant::now() + Duration::from_secs(100 * 365 * 86400),
        Lane::Changed,
        ReconcileReason::Unknown,
    );
    assert_eq!(queue.waiting(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_purged_key_still_running_cannot_start_again_until_that_run_ends() {
    let mut queue = queue();
    push(&mut queue, key("gone", "x"));
    let running = ready_now(&mut queue).unwrap();
    queue.purge(&"gone".into());
    // The cluster comes back and the key is pushed while the old run
    // has not yet noticed its cancellation.
    push(&mut queue, key("gone", "x"));
    assert_eq!(ready_now(&mut queue), None);
    queue.complete(&running, Outcome::Interrupted);
    assert_eq!(ready_now(&mut queue), Some(key("gone", "x")));
}

#[tokio::test(start_paused = true)]
async fn a_purged_keys_late_failure_counts_for_nothing() {
    let mut queue = queue();
    push(&mut queue, key("gone", "x"));
    let running = ready_now(&mut queue).unwrap();
    queue.purge(&"gone".into());
    push(&mut queue, key("gone", "x"));
    // The cancelled run ends late, and in error.
    queue.complete(&running, Outcome::Failure(None));
    assert_eq!(
        queue.failures(&key("gone", "x")),
        0,
        "the purge forgot the key's failures, and the old run adds none"
    );
    assert_eq!(ready_now(&mut queue), Some(key("gone", "x")));
}

#[tokio::test(start_paused = true)]
async fn an_unbounded_backoff_is_clamped_instead_of_panicking() {
    let mut queue = Queue::new(
        Backoff {
            base: Duration::from_secs(1),
            max: Duration::MAX,
            jitter: 0.5,
        },
        Limits::default(),
    );
    push(&mut queue, key("a", "x"));
    let k = ready_now(&mut queue).unwrap();
    for _ in 0..80 {
        queue.complete(&k, Outcome::Failure(None));
        assert_eq!(queue.waiting(), 1);
        // Run it again at once, as a change would.
        push(&mut queue, k.clone());
        assert_eq!(ready_now(&mut queue), Some(k.clone()));
    }
}

#[tokio::test(start_paused = true)]
async fn the_waiting_count_follows_every_change() {
    let mut queue = queue();
    let counted = |queue: &Queue| {
        queue
            .keys
            .states()
            .filter(|s| matches!(s.phase, Phase::Ready { .. } | Phase::Delayed { .. }))
            .count()
    };
    push(&mut queue, key("a", "1"));
    push(&mut queue, key("b", "2"));
    queue.schedule(
        key("a", "3"),
        Instant::now() + Duration::from_secs(5),
        Lane::Changed,
        ReconcileReason::Unknown,
    );
    assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
    push(&mut queue, key("a", "3"));
    assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
    let k = ready_now(&mut queue).unwrap();
    assert_eq!((queue.waiting(), counted(&queue)), (2, 2));
    queue.complete(&k, Outcome::Failure(None));
    assert_eq!((queue.waiting(), counted(&queue)), (3, 3));
    queue.purge(&"a".into());
    assert_eq!((queue.waiting(), counted(&queue)), (1, 1));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(ready_now(&mut queue).is_some());
    assert_eq!((queue.waiting(), counted(&queue)), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn each_clusters_figures_are_counted_and_go_with_the_cluster() {
    let metrics = QueueMetrics::default();
    let mut queue = queue();
    queue.count_in(metrics.clone());
    let figures = |name: &str| {
        metrics
            .clusters()
            .into_iter()
            .find(|(cluster, _)| cluster == name)
            .map(|(_, figures)| figures)
    };
    queue.hold(&ClusterName::from("b"));
    assert_eq!(
        figures("b").map(|f| f.depth),
        Some(0),
        "served from the start"
    );
    for name in ["x", "y", "z"] {
        push(&mut queue, key("a", name));
    }
    // Pushed again while waiting: not added again.
    push(&mut queue, key("a", "x"));
    let a = figures("a").unwrap();
    assert_eq!((a.depth, a.adds), (3, 3));

    tokio::time::advance(Duration::from_millis(20)).await;
    let x = ready_now(&mut queue).unwrap();
    let y = ready_now(&mut queue).unwrap();
    let a = figures("a").unwrap();
    assert_eq!(a.depth, 1, "two run, one waits");
    assert_eq!(a.queue_duration.count, 2);
    assert_eq!(a.queue_duration.sum, Duration::from_millis(40));

    tokio::time::advance(Duration::from_secs(2)).await;
    let a = figures("a").unwrap();
    assert_eq!(a.unfinished_work, Duration::from_secs(4));
    assert_eq!(a.longest_running, Duration::from_secs(2));
    queue.complete(&x, success());
    queue.complete(&y, Outcome::Failure(None));
    let a = figures("a").unwrap();
    assert_eq!(a.work_duration.count, 2);
    assert_eq!(a.work_duration.sum, Duration::from_secs(4));
    assert_eq!(a.work_duration.buckets[8], 0, "none within a second");
    assert_eq!(a.work_duration.buckets[9], 2, "both within ten");
    assert_eq!(a.retries, 1, "the failure is retried");
    assert_eq!(
        a.depth, 1,
        "z is ready; y, retried later, is delayed and not counted"
    );
    assert_eq!(a.unfinished_work, Duration::ZERO);
    assert_eq!(figures("b").map(|f| f.adds), Some(0));

    queue.purge(&ClusterName::from("a"));
    assert!(figures("a").is_none(), "its series go with the cluster");
    assert!(figures("b").is_some());
}

#[tokio::test]
async fn a_run_that_ended_is_no_longer_counted_as_under_way() {
    let metrics = QueueMetrics::default();
    let mut queue = queue();
    queue.count_in(metrics.clone());
    // Served: its entry, and its figures, stay while it has no key.
    queue.hold(&ClusterName::from("a"));
    queue.release(&ClusterName::from("a"));
    for name in ["x", "y"] {
        push(&mut queue, key("a", name));
    }
    let started = start_all_now(&mut queue);
    std::thread::sleep(Duration::from_millis(2));
    queue.complete(&started[0], success());
    let a = &metrics.clusters()[0].1;
    assert!(a.longest_running > Duration::ZERO, "one still runs");
    queue.complete(&started[1], success());
    let a = &metrics.clusters()[0].1;
    assert_eq!(a.longest_running, Duration::ZERO, "none runs");
    assert_eq!(a.unfinished_work, Duration::ZERO);
    assert_eq!(a.work_duration.count, 2);
}

#[tokio::test(start_paused = true)]
async fn an_echo_waits_behind_changes_and_the_backlog_but_not_for_ever() {
    let mut queue = queue();
    let echo = key("a", "echo");
    queue.push(echo.clone(), Lane::Echoed, ReconcileReason::Unknown);
    let backlog = lanes::ECHO_EVERY as usize + 20;
    for i in 0..backlog {
        queue.push(
            key("a", &format!("listed-{i}")),
            Lane::Listed,
            ReconcileReason::Listed,
        );
    }
    push(&mut queue, key("a", "changed"));
    let ran = run_all_now(&mut queue);
    assert_eq!(ran.len(), backlog + 2);
    let at = ran.iter().position(|k| *k == echo).unwrap();
    assert_eq!(
        at,
        lanes::ECHO_EVERY as usize,
        "after a hundred others, not later"
    );
    // Alone, it runs at once.
    queue.push(echo.clone(), Lane::Echoed, ReconcileReason::Unknown);
    assert_eq!(run_all_now(&mut queue), [echo]);
}

#[tokio::test(start_paused = true)]
async fn an_echo_promoted_by_a_change_runs_as_a_change_and_once() {
    let mut queue = queue();
    let x = key("a", "x");
    queue.push(x.clone(), Lane::Echoed, ReconcileReason::Unknown);
    for i in 0..5 {
        queue.push(
            key("a", &format!("listed-{i}")),
            Lane::Listed,
            ReconcileReason::Listed,
        );
    }
    push(&mut queue, x.clone());
    let ran = run_all_now(&mut queue);
    assert_eq!(ran[0], x, "promoted ahead of the backlog");
    assert_eq!(ran.iter().filter(|k| **k == x).count(), 1);
    assert_eq!(queue.waiting(), 0);
}
