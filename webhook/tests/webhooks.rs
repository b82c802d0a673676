//! The webhook server against real API servers: each cluster's requests
//! checked, defaulted and converted by one server, registrations following
//! the fleet, tokens, failing handlers and certificates read again.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::{Api, api::PostParams};
use kube_multicluster::{ClusterName, Fleet};
use kube_multicluster_envtest::Envtest;
use kube_multicluster_webhook::{
    Certificates, Error, FailurePolicy, SERVER_LABEL, Webhook, Webhooks,
};
use support::*;
use tower::service_fn;

/// In every cluster: a widget over size 10 is denied with the handler's
/// message (naming the cluster that asked), one within is admitted and
/// stored blue, and read at v2 through the conversion webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_is_checked_defaulted_and_converted() {
    let (env, fleet) = widget_fleet(&["hub", "member-a", "member-b"]).await;
    let (listener, url) = listener();
    let server = widget_webhooks("widgets-test", &url)
        .start(&fleet, listener, None)
        .unwrap();
    let registering = tokio::spawn(server.register());

    for cluster in env.clusters() {
        let client = cluster.client();
        let denied = create_until(&client, &widget("big", 11), |r| r.is_err()).await;
        let message = message(&denied);
        assert!(
            message.contains(&format!("size 11 is over 10 in cluster {}", cluster.name())),
            "{message}"
        );
        let Err(kube::Error::Api(status)) = &denied else {
            unreachable!()
        };
        assert_eq!(status.code, 422, "the handler's code: {status:?}");

        let made = Api::<Widget>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &widget("small", 3))
            .await
            .unwrap();
        assert_eq!(made.spec.color.as_deref(), Some("blue"), "defaulted");
        assert_eq!(made.spec.shape.as_deref(), Some("round"), "defaulted");
        let v2 = read_v2(&client, "small").await;
        assert_eq!(v2.data["spec"]["length"], 3, "{v2:?}");
        assert_eq!(v2.data["spec"].get("size"), None, "{v2:?}");
        assert_eq!(v2.types.unwrap().api_version, "example.com/v2");
    }

    // The registrations are the server's, labelled as such.
    let hub = env.cluster("hub").unwrap().client();
    let configuration = Api::<ValidatingWebhookConfiguration>::all(hub)
        .get("widgets-test")
        .await
        .unwrap();
    assert_eq!(
        configuration.metadata.labels.unwrap()[SERVER_LABEL],
        "widgets-test"
    );
    registering.abort();
}

/// A member engaged after the server started is registered in and its
/// widgets checked; a member that leaves has the registration removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_join_are_registered_and_those_that_leave_are_cleaned() {
    let env = Envtest::builder()
        .clusters(["first", "later"])
        .start()
        .await
        .unwrap();
    let fleet = Fleet::new();
    for cluster in env.clusters() {
        install_crd(&cluster.client()).await;
    }
    let first = env.cluster("first").unwrap().client();
    let later = env.cluster("later").unwrap().client();
    fleet.engage("first", first.clone());
    let (listener, url) = listener();
    let server = widget_webhooks("joining", &url)
        .start(&fleet, listener, None)
        .unwrap();
    let registering = tokio::spawn(server.register());
    create_until(&first, &widget("big", 11), |r| r.is_err())
        .await
        .unwrap_err();

    // Not engaged: nothing registered, a big widget is admitted.
    let configurations = Api::<ValidatingWebhookConfiguration>::all(later.clone());
    assert!(configurations.get_opt("joining").await.unwrap().is_none());
    Api::<Widget>::namespaced(later.clone(), "default")
        .create(&PostParams::default(), &widget("early", 20))
        .await
        .unwrap();

    fleet.engage("later", later.clone());
    let denied = create_until(&later, &widget("big", 12), |r| r.is_err()).await;
    assert!(message(&denied).contains("in cluster later"), "{denied:?}");

    fleet.disengage("later");
    let deadline = Instant::now() + PATIENCE;
    while configurations.get_opt("joining").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the registration stayed in a cluster that left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Engaged again; once registered there, let go and engaged once more
    // at once: the removal for the engagement that ended reads the
    // registration, the new engagement's write of the same object changes
    // nothing, and the removal must not take it all the same.
    fleet.engage("later", later.clone());
    let denied = create_until(&later, &widget("big", 13), |r| r.is_err()).await;
    assert!(message(&denied).contains("in cluster later"), "{denied:?}");
    // Several times, some with a moment between the two, so that the
    // removal and the write meet in every order.
    for pause in [0, 5, 0, 20, 0, 50, 0, 100, 0, 200] {
        fleet.disengage("later");
        tokio::time::sleep(Duration::from_millis(pause)).await;
        fleet.engage("later", later.clone());
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // The removals take well under a second; the registration must be
    // there after them, and stay.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while configurations.get_opt("joining").await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the registration of the engagement that stays was removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let denied = create_until(&later, &widget("big", 14), |r| r.is_err()).await;
    assert!(message(&denied).contains("in cluster later"), "{denied:?}");
    // The first cluster keeps its own.
    assert!(
        Api::<ValidatingWebhookConfiguration>::all(first)
            .get_opt("joining")
            .await
            .unwrap()
            .is_some()
    );
    registering.abort();
}

/// A request whose URL carries another cluster's token, or none, or the
/// token of a cluster no longer engaged, is denied without its handler
/// seeing it; the right token is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_another_clusters_token_or_none_is_denied() {
    let env = Envtest::builder()
        .clusters(["member-a", "member-b"])
        .start()
        .await
        .unwrap();
    let fleet = Fleet::new();
    for cluster in env.clusters() {
        fleet.engage(cluster.name(), cluster.client());
    }
    let (listener, url) = listener();
    let server = widget_webhooks("tokens", &url)
        .start(&fleet, listener, None)
        .unwrap();
    let port = server.local_addr().port();
    let ca = server.ca_bundle();
    let a = path_of(
        &server
            .registered_address(&"member-a".into(), VALIDATE)
            .unwrap(),
    );
    let b = path_of(
        &server
            .registered_address(&"member-b".into(), VALIDATE)
            .unwrap(),
    );
    let token_of = |path: &str| path.split('/').nth(3).unwrap().to_owned();

    // Its own token: served, and the handler names the cluster.
    let (status, answer) = post(port, &ca, &a, review("big", 11)).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["uid"], "0000-1111");
    let said = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(said.contains("in cluster member-a"), "{answer}");

    // Member b's token on member a's path, and no token at all: denied,
    // with a 403, even for a widget the handler would admit.
    let stolen = format!("/fleet/member-a/{}/{VALIDATE}", token_of(&b));
    for path in [
        stolen,
        format!("/fleet/member-a//{VALIDATE}"),
        format!("/fleet/member-a/{}/{VALIDATE}", "0".repeat(64)),
    ] {
        let (status, answer) = post(port, &ca, &path, review("small", 1)).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(answer["response"]["allowed"], false, "{path}: {answer}");
        assert_eq!(answer["response"]["status"]["code"], 403, "{answer}");
        let said = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(said.contains("no valid token"), "{said}");
    }
    // A path of another shape is not found.
    let (status, _) = post(port, &ca, "/validate", review("small", 1)).await;
    assert_eq!(status, 404);

    // A cluster that left: its token is no longer served.
    fleet.disengage("member-b");
    let (_, answer) = post(port, &ca, &b, review("small", 1)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let said = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(said.contains("not engaged"), "{said}");
}

/// A handler that panics, hangs or fails is answered for in time, with a
/// message that says so; under `Ignore` the request is admitted with a
/// warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_hangs_or_fails_is_answered_for_in_time() {
    let (env, fleet) = widget_fleet(&["only"]).await;
    let cluster = &env.clusters()[0];
    let client = cluster.client();
    let (listener, url) = listener();
    let server = widget_webhooks("failing", &url)
        .start(&fleet, listener, None)
        .unwrap();
    let registering = tokio::spawn(server.register());
    create_until(&client, &widget("big", 11), |r| r.is_err())
        .await
        .unwrap_err();

    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let began = Instant::now();
    let panicked = api.create(&PostParams::default(), &widget("boom", 1)).await;
    let said = message(&panicked);
    assert!(
        said.contains("panicked: the handler broke on purpose"),
        "{said}"
    );

    let began_hang = Instant::now();
    let hung = api.create(&PostParams::default(), &widget("hang", 1)).await;
    let said = message(&hung);
    // The webhook's timeout is 3 s: the handler is given 2.4 s, and the
    // answer comes before the API server gives up.
    assert!(said.contains("gave no answer within 2.4s"), "{said}");
    assert!(
        began_hang.elapsed() < Duration::from_secs(3),
        "{:?}",
        began_hang.elapsed()
    );

    let failed = api.create(&PostParams::default(), &widget("fail", 1)).await;
    assert!(message(&failed).contains("failed: the handler failed on purpose"));
    assert!(began.elapsed() < Duration::from_secs(20));

    // The same handlers under Ignore: admitted, with the reason as a warning.
    registering.abort();
    drop(server);
    let (listener, url) = support::listener();
    let ignoring = Webhooks::new("ignoring")
        .validate(
            Webhook::new(VALIDATE)
                .failure_policy(FailurePolicy::Ignore)
                .timeout(Duration::from_secs(1)),
            service_fn(validate),
        )
        .external_url(&url)
        .members(kube_multicluster::controller::ClusterSelector::All)
        .start(&fleet, listener, None)
        .unwrap();
    let path = path_of(
        &ignoring
            .registered_address(&ClusterName::from(cluster.name()), VALIDATE)
            .unwrap(),
    );
    let (_, answer) = post(
        ignoring.local_addr().port(),
        &ignoring.ca_bundle(),
        &path,
        review("boom", 1),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let warning = answer["response"]["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("panicked") && warning.contains("Ignore"),
        "{warning}"
    );
    let (_, answer) = post(
        ignoring.local_addr().port(),
        &ignoring.ca_bundle(),
        &path,
        review("hang", 1),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

/// Files that cannot be served, a URL the API servers cannot call and a
/// webhook name they would refuse are errors that name them, at start.
#[tokio::test]
async fn bad_files_urls_and_names_are_refused_at_start_naming_them() {
    let fleet = Fleet::new();
    let dir =
        std::env::temp_dir().join(format!("kube-multicluster-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.crt");
    let garbage = dir.join("garbage.crt");
    std::fs::write(&garbage, "not a certificate").unwrap();

    let start = |webhooks: Webhooks| {
        let (listener, _) = listener();
        webhooks.start(&fleet, listener, None).unwrap_err()
    };
    let error =
        start(Webhooks::new("w").certificates(Certificates::files(&missing, dir.join("k"))));
    assert!(
        matches!(&error, Error::Certificate { path, .. } if *path == missing),
        "{error}"
    );
    assert!(error.to_string().contains("missing.crt"), "{error}");
    let error =
        start(Webhooks::new("w").certificates(Certificates::files(&garbage, dir.join("k"))));
    assert!(error.to_string().contains("garbage.crt"), "{error}");
    assert!(error.to_string().contains("no PEM certificate"), "{error}");

    let error = start(Webhooks::new("w").external_url("http://example.com"));
    assert!(matches!(error, Error::Url { .. }), "{error}");
    let error = start(Webhooks::new("w").external_url("https://example.com/webhooks"));
    assert!(error.to_string().contains("without a path"), "{error}");
    for bad in [
        "https://::1:9443",
        "https://example.com:99999",
        "https://[::1",
    ] {
        let error = start(Webhooks::new("w").external_url(bad));
        assert!(matches!(error, Error::Url { .. }), "{bad}: {error}");
    }
    for good in ["https://[::1]:9443/", "https://example.com:9443"] {
        let (listener, _) = listener();
        Webhooks::new("w")
            .external_url(good)
            .start(&fleet, listener, None)
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    // A key file's bytes are its key, whitespace included.
    let key = dir.join("key");
    std::fs::write(
        &key,
        [b' '; 32].iter().chain(b"\n").copied().collect::<Vec<u8>>(),
    )
    .unwrap();
    let (listener, _) = listener();
    Webhooks::new("w")
        .token_key_file(&key)
        .start(&fleet, listener, None)
        .expect("32 bytes of spaces are a key");
    let error = start(Webhooks::new("w").validate(Webhook::new("validate"), service_fn(validate)));
    assert!(error.to_string().contains("\"validate\""), "{error}");
    let error = start(
        Webhooks::new("w")
            .validate(Webhook::new(VALIDATE), service_fn(validate))
            .validate(Webhook::new(VALIDATE), service_fn(validate)),
    );
    assert!(error.to_string().contains("two webhooks"), "{error}");
    let error = start(Webhooks::new("w").token_key(vec![1; 8]));
    assert!(error.to_string().contains("at least 32"), "{error}");
    let error = start(Webhooks::new("w").token_key_file(dir.join("no-key")));
    assert!(error.to_string().contains("no-key"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A certificate rotated on disk (the same CA, a new serving certificate)
/// is served from the next connection on, while writes go on without one
/// failing; a pair that cannot be served is reported and the last good one
/// kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_rotated_on_disk_is_served_without_a_failed_request() {
    let (env, fleet) = widget_fleet(&["only"]).await;
    let cluster = &env.clusters()[0];
    let client = cluster.client();

    let dir = tempdir("rotation");
    let ca = kube_multicluster_envtest::TestCa::new().unwrap();
    let first = ca.serving(&["127.0.0.1"]).unwrap();
    let second = ca.serving(&["127.0.0.1"]).unwrap();
    let (cert, key, ca_file) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("ca.crt"));
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    swap_in(&cert, &first.cert_pem, &key, &first.key_pem);

    let (listener, url) = listener();
    let server = widget_webhooks("rotation", &url)
        .certificates(
            Certificates::files(&cert, &key)
                .ca_file(&ca_file)
                .reload_every(Duration::from_millis(100)),
        )
        .start(&fleet, listener, None)
        .unwrap();
    assert_eq!(server.certificate_chain()[0], first.der);
    let registering = tokio::spawn(server.register());
    create_until(&client, &widget("big", 11), |r| r.is_err())
        .await
        .unwrap_err();

    // Writes all along, each through the webhooks.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writes = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let api: Api<Widget> = Api::namespaced(client, "default");
            let (mut done, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match api
                    .create(&PostParams::default(), &widget(&format!("w-{done}"), 1))
                    .await
                {
                    Ok(_) => done += 1,
                    Err(error) => failed.push(error.to_string()),
                }
            }
            (done, failed)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A pair that does not match is not served; the problem names the file.
    swap_in(&cert, &second.cert_pem, &key, &first.key_pem);
    let problems = tokio::time::timeout(
        PATIENCE,
        fleet
            .problems()
            .wait_for(|set| set.contains_key("webhook certificate")),
    )
    .await
    .expect("the pair that does not match is reported");
    let problem = &problems["webhook certificate"];
    assert!(problem.contains("tls.key"), "{problem}");
    assert_eq!(server.certificate_chain()[0], first.der);

    swap_in(&cert, &second.cert_pem, &key, &second.key_pem);
    let deadline = Instant::now() + PATIENCE;
    while server.certificate_chain()[0] != second.der {
        assert!(
            Instant::now() < deadline,
            "the new certificate was not read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fleet.problems().get("webhook certificate"), None, "cleared");
    let path = path_of(
        &server
            .registered_address(&ClusterName::from(cluster.name()), VALIDATE)
            .unwrap(),
    );
    let (_, answer, presented) = post_seeing_certificate(
        server.local_addr().port(),
        &server.ca_bundle(),
        &path,
        review("small", 1),
    )
    .await;
    assert_eq!(
        presented, second.der,
        "a new connection gets the new certificate"
    );
    assert_eq!(answer["response"]["allowed"], true);

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (done, failed) = writes.await.unwrap();
    assert!(
        failed.is_empty(),
        "writes failed across the rotation: {failed:?}"
    );
    assert!(done > 5, "{done} writes");
    registering.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 200 admission requests at once, from three clusters, are all answered;
/// the latency each client saw is reported, and the server's metrics count
/// them by cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_from_three_clusters_are_all_answered() {
    let (env, fleet) = widget_fleet(&["one", "two", "three"]).await;
    let mut registry = prometheus_client::registry::Registry::default();
    let (listener, url) = listener();
    let server = widget_webhooks("load", &url)
        .start(&fleet, listener, Some(&mut registry))
        .unwrap();
    let registering = tokio::spawn(server.register());
    for cluster in env.clusters() {
        create_until(&cluster.client(), &widget("big", 11), |r| r.is_err())
            .await
            .unwrap_err();
    }

    let creates = (0..200).map(|i| {
        let client = env.clusters()[i % 3].client();
        async move {
            let began = Instant::now();
            let made = Api::<Widget>::namespaced(client, "default")
                .create(
                    &PostParams::default(),
                    &widget(&format!("load-{i}"), 1 + (i as i64 % 10)),
                )
                .await;
            (made, began.elapsed())
        }
    });
    let results = futures::future::join_all(creates).await;
    let mut took: Vec<Duration> = Vec::new();
    for (made, elapsed) in results {
        let made = made.expect("every request answered and admitted");
        assert_eq!(made.spec.color.as_deref(), Some("blue"));
        took.push(elapsed);
    }
    took.sort();
    let p50 = took[took.len() / 2];
    let p99 = took[took.len() * 99 / 100];
    println!(
        "200 concurrent creates through the webhooks, 3 clusters: p50 {p50:?}, p99 {p99:?}, max {:?}",
        took[199]
    );

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for cluster in ["one", "two", "three"] {
        let answered: f64 = text
            .lines()
            .filter(|line| {
                line.starts_with("controller_runtime_webhook_requests_total{")
                    && line.contains(&format!("cluster=\"{cluster}\""))
                    && line.contains(&format!("webhook=\"{DEFAULT}\""))
            })
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        // 67 or 66 creates each, and the tries before the webhooks held.
        assert!(answered >= 66.0, "{cluster}: {answered}\n{text}");
    }
    assert!(
        text.contains("controller_runtime_webhook_latency_seconds_bucket{"),
        "{text}"
    );
    // The server's own time per request, from its histogram: every
    // series' buckets added up.
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text
        .lines()
        .filter(|line| line.starts_with("controller_runtime_webhook_latency_seconds_bucket{"))
    {
        let le = line
            .split("le=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        match buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, total)) => *total += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().unwrap().1;
    let p99_bound = buckets
        .iter()
        .find(|(_, count)| *count >= total * 0.99)
        .unwrap()
        .0;
    println!("the server's answers, both webhooks: {total} requests, p99 at most {p99_bound} s");
    registering.abort();
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kube-multicluster-webhook-{what}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes the pair as a mounted Secret changes: each file replaced whole.
fn swap_in(cert: &std::path::Path, cert_pem: &str, key: &std::path::Path, key_pem: &str) {
    for (path, pem) in [(key, key_pem), (cert, cert_pem)] {
        let next = path.with_extension("next");
        std::fs::write(&next, pem).unwrap();
        std::fs::rename(&next, path).unwrap();
    }
}
