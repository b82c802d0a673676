//! Webhooks in the manager, on real API servers: every replica serves them
//! from its start, the leader alone registers them (through its own URL),
//! a standby answers a request sent to it, and the next leader registers
//! its own; replicas without a shared token key are refused.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, api::PostParams};
use kube_multicluster::{
    Fleet,
    envtest::Envtest,
    manager::{Error, LeaderElection, LeaseParams, Manager, Role},
    webhook::{AdmissionRequest, Certificates, Verdict, Webhook, Webhooks},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::oneshot,
    task::JoinHandle,
    time::Instant,
};
use tower::{BoxError, service_fn};

const PATIENCE: Duration = Duration::from_secs(30);
const VALIDATE: &str = "validate.configmaps.example.com";

/// ConfigMaps named `forbidden-*` are refused, naming the cluster.
async fn validate(request: AdmissionRequest<ConfigMap>) -> Result<Verdict<ConfigMap>, BoxError> {
    let name = request.name.clone();
    Ok(if name.starts_with("forbidden") {
        Verdict::deny(format!(
            "{name} is forbidden in {}",
            request.cluster().name().as_str()
        ))
    } else {
        Verdict::allow()
    })
}

struct Replica {
    port: u16,
    endpoints: u16,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<Result<(), Error>>,
    status: kube_multicluster::manager::ElectionStatus,
}

/// The files every replica serves from, as a mounted Secret gives them:
/// `tls.crt`, `tls.key`, `ca.crt`.
struct Tls {
    dir: std::path::PathBuf,
    ca: String,
}

impl Tls {
    fn new(what: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kube-multicluster-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = kube_multicluster::envtest::TestCa::new().unwrap();
        let serving = ca.serving(&["127.0.0.1"]).unwrap();
        std::fs::write(dir.join("tls.crt"), &serving.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &serving.key_pem).unwrap();
        std::fs::write(dir.join("ca.crt"), ca.cert_pem()).unwrap();
        Self {
            dir,
            ca: ca.cert_pem().to_owned(),
        }
    }

    fn certificates(&self) -> Certificates {
        Certificates::files(self.dir.join("tls.crt"), self.dir.join("tls.key"))
            .ca_file(self.dir.join("ca.crt"))
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replica(
    name: &str,
    hub: Client,
    member: Client,
    key: Option<Vec<u8>>,
    certificates: Option<Certificates>,
) -> Replica {
    let fleet = Fleet::new();
    fleet.engage("member", member);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let endpoints = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoints_port = endpoints.local_addr().unwrap().port();
    let mut webhooks = Webhooks::new("replicated")
        .validate(
            Webhook::new(VALIDATE)
                .operations([kube_multicluster::webhook::Operation::Create])
                .object_selector(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                        match_labels: Some([("checked".to_owned(), "yes".to_owned())].into()),
                        ..Default::default()
                    },
                ),
            service_fn(validate),
        )
        .external_url(format!("https://127.0.0.1:{port}"));
    if let Some(key) = key {
        webhooks = webhooks.token_key(key);
    }
    if let Some(certificates) = certificates {
        webhooks = webhooks.certificates(certificates);
    }
    let election = LeaderElection::new("webhooks").lease(
        LeaseParams::default()
            .namespace("default")
            .identity(name)
            .client(hub)
            .lease_duration(Duration::from_secs(4))
            .renew_deadline(Duration::from_secs(3))
            .retry_period(Duration::from_secs(1)),
    );
    let status = election.status();
    let (stop, stopped) = oneshot::channel::<()>();
    let manager = Manager::new(&fleet)
        .leader_election(election)
        .endpoints_on(endpoints)
        .webhooks_on(webhooks, listener)
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        });
    Replica {
        port,
        endpoints: endpoints_port,
        stop: Some(stop),
        run: tokio::spawn(manager.run()),
        status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_serves_the_webhooks_and_the_leader_registers_them() {
    let env = Envtest::builder()
        .clusters(["hub", "member"])
        .start()
        .await
        .unwrap();
    let hub = env.cluster("hub").unwrap().client();
    let member = env.cluster("member").unwrap().client();
    let key = vec![42; 32];
    let tls = Tls::new("replicas");

    let mut a = replica(
        "a",
        hub.clone(),
        member.clone(),
        Some(key.clone()),
        Some(tls.certificates()),
    );
    wait_for_role(&a, Role::Leading).await;
    let b = replica(
        "b",
        hub.clone(),
        member.clone(),
        Some(key.clone()),
        Some(tls.certificates()),
    );

    // Registered by a, through a's address; enforced in the member.
    let url = registered_url(&member, |url| url.contains(&format!(":{}/", a.port))).await;
    let denied = create_until_denied(&member, "forbidden-1").await;
    assert!(
        denied.contains("forbidden-1 is forbidden in member"),
        "{denied}"
    );

    // b, standing by, serves too, and is ready; the same path answers there.
    let readyz = get(b.endpoints, "/readyz").await;
    assert!(readyz.contains("webhooks: serving 1 on"), "{readyz}");
    assert!(readyz.contains("standby"), "{readyz}");
    let path = &url[url.find("/fleet/").unwrap()..];
    let answer = post_tls(b.port, &tls.ca, path, review("forbidden-2")).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let said = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        said.contains("forbidden-2 is forbidden in member"),
        "{said}"
    );

    // a hands over: b registers through its own address.
    a.stop.take().unwrap().send(()).unwrap();
    a.run.await.unwrap().unwrap();
    registered_url(&member, |url| url.contains(&format!(":{}/", b.port))).await;
    let denied = create_until_denied(&member, "forbidden-3").await;
    assert!(
        denied.contains("forbidden-3 is forbidden in member"),
        "{denied}"
    );
    let metrics = get(b.endpoints, "/metrics").await;
    assert!(
        metrics.contains("controller_runtime_webhook_requests_total{webhook=\"validate.configmaps.example.com\",cluster=\"member\",code=\"200\"}"),
        "{metrics}"
    );
    b.run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_without_a_shared_token_key_or_certificate_are_refused() {
    let env = Envtest::start(1).await.unwrap();
    let client = env.clusters()[0].client();
    let tls = Tls::new("refused");
    let keyless = replica(
        "alone",
        client.clone(),
        client.clone(),
        None,
        Some(tls.certificates()),
    );
    let error = keyless.run.await.unwrap().unwrap_err();
    assert!(matches!(error, Error::Invalid { .. }), "{error}");
    assert!(error.to_string().contains("token_key_file"), "{error}");
    // Certificates made at start: each replica's CA would be its own.
    let generated = replica("alone", client.clone(), client, Some(vec![1; 32]), None);
    let error = generated.run.await.unwrap().unwrap_err();
    assert!(error.to_string().contains("Certificates::files"), "{error}");
}

async fn wait_for_role(replica: &Replica, role: Role) {
    let deadline = Instant::now() + PATIENCE;
    while replica.status.role() != role {
        assert!(Instant::now() < deadline, "never {role:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The URL the member's configuration sends to, once `wanted` holds for it.
async fn registered_url(member: &Client, wanted: impl Fn(&str) -> bool) -> String {
    let api = Api::<ValidatingWebhookConfiguration>::all(member.clone());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let url = api
            .get_opt("replicated")
            .await
            .unwrap()
            .and_then(|c| c.webhooks?.into_iter().next()?.client_config.url);
        if let Some(url) = url.filter(|url| wanted(url)) {
            return url;
        }
        assert!(Instant::now() < deadline, "not registered as expected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a checked ConfigMap named `name` until the webhook refuses it;
/// the refusal's message.
async fn create_until_denied(member: &Client, name: &str) -> String {
    let api = Api::<ConfigMap>::namespaced(member.clone(), "default");
    let mut config_map = ConfigMap::default();
    config_map.metadata.name = Some(name.to_owned());
    config_map.metadata.labels = Some([("checked".to_owned(), "yes".to_owned())].into());
    let deadline = Instant::now() + PATIENCE;
    loop {
        match api.create(&PostParams::default(), &config_map).await {
            Err(kube::Error::Api(status)) => return status.message,
            Err(other) => panic!("{other}"),
            Ok(_) => {
                api.delete(name, &Default::default()).await.unwrap();
            }
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET path` from the endpoints on `port`: the body.
async fn get(port: u16, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nhost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// Posts `body` to the webhook server on `port` over TLS, trusting `ca`,
/// with HTTP/1.0 so that the server closes the connection after its answer.
async fn post_tls(port: u16, ca: &str, path: &str, body: Value) -> Value {
    use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.0\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8(answer).unwrap();
    let json = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    serde_json::from_str(json).unwrap()
}

fn review(name: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": name,
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}},
            "dryRun": false
        }
    })
}

/// The manager's roles carry what registration needs, in the members'
/// role for an external URL and in the local one for a Service.
#[tokio::test]
async fn the_roles_carry_the_rights_registration_needs() {
    let fleet = Fleet::new();
    let webhooks = Webhooks::new("roles")
        .validate(Webhook::new(VALIDATE), service_fn(validate))
        .convert(
            kube_multicluster::webhook::Conversion::new("widgets.example.com"),
            service_fn(
                |request: kube_multicluster::webhook::ConversionRequest| async move {
                    Ok::<_, BoxError>(request.into_objects())
                },
            ),
        )
        .external_url("https://webhooks.example.com");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let manager = Manager::new(&fleet).webhooks_on(webhooks, listener);
    let permissions = manager.permissions();
    use kube_multicluster::rbac::{Rule, Scope};
    let members = permissions.rules(Scope::Members);
    for rule in [
        Rule::new(
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            ["create", "delete", "get", "patch"],
        ),
        Rule::new(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            ["get", "patch"],
        ),
    ] {
        assert!(members.contains(&rule), "{members:?}");
    }
    assert!(
        !permissions
            .rules(Scope::Local)
            .iter()
            .any(|rule| rule.resources.iter().any(|r| r.contains("webhook"))),
        "no Service, so nothing registered in the local cluster"
    );
    let yaml = manager.rbac_yaml("roles");
    assert!(yaml.contains("- mutatingwebhookconfigurations"), "{yaml}");
}
