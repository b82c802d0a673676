//! One test cluster: a `kube-apiserver` process, its credentials, the proxy
//! that fronts it, a client, and the faults a test gives it on purpose.

mod credentials;

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use hyper_util::rt::TokioExecutor;
use k8s_openapi::{
    api::core::v1::Namespace,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    client::{Body, ClientBuilder, ConfigExt},
    config::Kubeconfig,
};

use crate::{
    DEFAULT_START_TIMEOUT, Error, FaultyLink, Result,
    fault::{FaultProxy, Traffic},
    kubeconfig,
    pki::{CertificateAuthority, Pki},
    process::{Deadline, Process, free_port},
};

/// One API server of an [`Envtest`](crate::Envtest) fleet.
///
/// It hands out what a test needs to talk to the cluster: a ready
/// [`Client`], an admin kubeconfig in memory and on disk, credentials for any
/// user ([`client_for`](Self::client_for)), [`stop`](Self::stop) /
/// [`restart`](Self::restart) of this API server alone, and network faults
/// ([`hang`](Self::hang), [`cut_off`](Self::cut_off), [`link`](Self::link)).
/// Its data lives in the fleet's etcd, so it survives a restart.
///
/// Clients reach the API server through a small TCP proxy of the cluster's
/// own on 127.0.0.1, which is what [`server`](Self::server) names; that is how
/// faults reach every client of the cluster, and why the address stays the
/// same when the API server restarts.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{Api, api::ListParams};
///
/// let fleet = kube_multicluster_envtest::Envtest::start(2).await?;
/// for cluster in fleet.clusters() {
///     let config_maps: Api<ConfigMap> = Api::default_namespaced(cluster.client());
///     let list = config_maps.list(&ListParams::default()).await.expect("list");
///     println!("{}: {} config maps, kubeconfig at {}", cluster.name(), list.items.len(),
///              cluster.kubeconfig_path().display());
/// }
/// # Ok(())
/// # }
/// ```
pub struct TestCluster {
    // Fields drop in order: the API server, then its proxy.
    name: String,
    binary: PathBuf,
    /// Every argument but `--secure-port`, which `run` adds.
    args: Vec<String>,
    process: Mutex<Option<Process>>,
    /// Forwards to the API server's own port, whichever it has now.
    proxy: FaultProxy,
    ca: CertificateAuthority,
    kubeconfig: Kubeconfig,
    kubeconfig_yaml: String,
    kubeconfig_path: PathBuf,
    client: Client,
    timeout: Duration,
}

impl std::fmt::Debug for TestCluster {
    // The kubeconfig holds the admin key and the CA holds its own; only say
    // where the kubeconfig is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("name", &self.name)
            .field("server", &self.server())
            .field("api_server", &self.proxy.upstream())
            .field("pid", &self.pid())
            .field("kubeconfig_path", &self.kubeconfig_path)
            .finish_non_exhaustive()
    }
}

/// Where a new API server keeps its files and data.
pub(crate) struct Placement<'a> {
    pub(crate) binary: &'a Path,
    pub(crate) etcd_url: String,
    /// Unique within the fleet's etcd, also across removed clusters.
    pub(crate) etcd_prefix: String,
    pub(crate) dir: PathBuf,
    pub(crate) timeout: Duration,
    /// Flags of the fleet's own, after the ones set here.
    pub(crate) extra_args: &'a [String],
}

impl TestCluster {
    pub(crate) async fn start(name: &str, placement: Placement<'_>) -> Result<Self> {
        let Placement {
            binary,
            etcd_url,
            etcd_prefix,
            dir,
            timeout,
            extra_args,
        } = placement;
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating directory {}", dir.display()), e))?;
        let pki = Pki::generate(name)?;
        let file = |file: &str, contents: &str| -> Result<String> {
            let path = dir.join(file);
            fs::write(&path, contents)
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
            Ok(path.display().to_string())
        };
        let ca = file("ca.crt", pki.ca.cert())?;
        let serving_cert = file("apiserver.crt", &pki.serving_cert)?;
        let serving_key = file("apiserver.key", &pki.serving_key)?;
        let sa_key = file("sa.key", &pki.service_account_key)?;
        let sa_pub = file("sa.pub", &pki.service_account_pub)?;

        let proxy = FaultProxy::bind(local(free_port()?))
            .map_err(|e| Error::io(format!("starting the proxy of cluster {name}"), e))?;
        let server = format!("https://{}", proxy.addr());
        let args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--etcd-prefix={etcd_prefix}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--cert-dir={}", dir.display()),
            format!("--tls-cert-file={serving_cert}"),
            format!("--tls-private-key-file={serving_key}"),
            format!("--client-ca-file={ca}"),
            format!("--service-account-issuer={server}"),
            format!("--service-account-key-file={sa_pub}"),
            format!("--service-account-signing-key-file={sa_key}"),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            // No controller-manager runs to create the default service accounts.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--profiling=false".to_owned(),
        ]
        .into_iter()
        .chain(extra_args.iter().cloned())
        .collect::<Vec<_>>();
        let admin = format!("{name}-admin");
        let kubeconfig = kubeconfig::kubeconfig(name, &server, &pki.ca, &admin, &pki.admin);
        let kubeconfig_path = dir.join("kubeconfig");
        let yaml = serde_saphyr::to_string(&kubeconfig).map_err(|e| {
            Error::io(
                format!("serialising the kubeconfig of cluster {name}"),
                std::io::Error::other(e),
            )
        })?;
        fs::write(&kubeconfig_path, &yaml)
            .map_err(|e| Error::io(format!("writing {}", kubeconfig_path.display()), e))?;
        let client = kubeconfig::client(kubeconfig.clone(), name)?;
        let cluster = Self {
            name: name.to_owned(),
            binary: binary.to_owned(),
            args,
            process: Mutex::new(None),
            proxy,
            ca: pki.ca,
            kubeconfig,
            kubeconfig_yaml: yaml,
            kubeconfig_path,
            client,
            timeout,
        };
        cluster.run().await?;
        Ok(cluster)
    }

    /// The cluster's name, also the name of its kubeconfig context.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A client with admin (`system:masters`) rights on this cluster.
    ///
    /// Cloning a [`Client`] is cheap; every clone shares one connection pool.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig, with certificates inline.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// Where the same kubeconfig is written as a file; it is removed with the fleet.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The same kubeconfig as YAML, the text a kubeconfig file or Secret
    /// holds: what a test puts into a Secret for a provider to read.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use k8s_openapi::{ByteString, api::core::v1::Secret};
    /// use kube::{Api, api::{ObjectMeta, PostParams}};
    ///
    /// let fleet = kube_multicluster_envtest::Envtest::start(2).await?;
    /// let (hub, east) = (&fleet.clusters()[0], &fleet.clusters()[1]);
    /// let secret = Secret {
    ///     metadata: ObjectMeta { name: Some("east".into()), ..ObjectMeta::default() },
    ///     data: Some([("kubeconfig".to_owned(), ByteString(east.kubeconfig_yaml().into()))].into()),
    ///     ..Secret::default()
    /// };
    /// Api::<Secret>::default_namespaced(hub.client())
    ///     .create(&PostParams::default(), &secret)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// The admin kubeconfig pointed at the API server itself, past the
    /// cluster's fault proxy.
    ///
    /// Faults ([`hang`](Self::hang), [`cut_off`](Self::cut_off)) do not
    /// reach clients built from it, and its address changes when the API
    /// server restarts. It is for benchmarks that measure their own process,
    /// which would otherwise count the proxy's tasks and buffers (the proxy
    /// runs in the process that started the fleet).
    pub fn direct_kubeconfig(&self) -> Kubeconfig {
        let server = format!("https://{}", self.proxy.upstream());
        kubeconfig::with_server(&self.kubeconfig, &server)
    }

    /// The cluster's URL, `https://127.0.0.1:<port>`, as in its kubeconfig.
    ///
    /// It is the address of the cluster's proxy, which forwards to the API
    /// server; it stays the same across [`restart`](Self::restart).
    pub fn server(&self) -> &str {
        kubeconfig::server(&self.kubeconfig)
    }

    /// The process id of the running API server, or `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.process().as_ref().map(Process::pid)
    }

    fn process(&self) -> MutexGuard<'_, Option<Process>> {
        // A panic while the lock was held cannot leave the option half-written.
        self.process.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lost_port_race(&self) -> bool {
        self.process().as_ref().is_some_and(Process::lost_port_race)
    }

    /// Starts the process on the port the proxy forwards to and waits until
    /// it is ready; if another process took that port in the meantime, on a
    /// new one. Clients never see the API server's own port.
    async fn run(&self) -> Result<()> {
        let mut attempt = 1;
        loop {
            let mut args = self.args.clone();
            args.push(format!("--secure-port={}", self.proxy.upstream().port()));
            let process = Process::spawn(
                format!("kube-apiserver of cluster {}", self.name),
                &self.binary,
                &args,
                self.kubeconfig_path.with_file_name("kube-apiserver.log"),
            )?;
            *self.process() = Some(process);
            match self.wait_ready().await {
                Err(Error::Exited { .. }) if attempt < 3 && self.lost_port_race() => {
                    attempt += 1;
                    self.proxy.set_upstream(local(free_port()?));
                }
                other => return other,
            }
        }
    }

    /// Waits until `/readyz` answers and the `default` namespace exists.
    async fn wait_ready(&self) -> Result<()> {
        let probe = self.readiness_probe()?;
        let namespaces: Api<Namespace> = Api::all(probe.clone());
        let ready = async || -> Result<(), String> {
            let readyz = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request is valid");
            probe
                .request_text(readyz)
                .await
                .map_err(|e| e.to_string())?;
            match namespaces.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("namespace default does not exist yet".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        };
        let (started, interval) = (Instant::now(), Duration::from_millis(100));
        let what = format!("kube-apiserver of cluster {}", self.name);
        let deadline = Deadline::new(what, started, self.timeout, interval);
        let mut why = None;
        loop {
            let exited = self.process().as_mut().and_then(Process::exit_error);
            if let Some(exited) = exited {
                return Err(exited);
            }
            let left = self.timeout.saturating_sub(started.elapsed());
            why = match tokio::time::timeout(left, ready()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => Some(error),
                // Out of time before it was asked: the last answer says why.
                Err(_) if left.is_zero() => why,
                Err(_) => Some("no answer".to_owned()),
            };
            deadline.not_yet(why.clone()).await?;
        }
    }

    /// An admin client for the API server's own port.
    ///
    /// It bypasses the proxy, so that a hung or cut-off cluster can restart,
    /// and kube's trace layer, which logs each refused connection and each
    /// `500` of `/readyz` while the API server starts as an ERROR.
    fn readiness_probe(&self) -> Result<Client> {
        let config = kubeconfig::config(self.direct_kubeconfig(), &self.name)?;
        let https = config
            .rustls_https_connector()
            .map_err(|e| Error::kube(format!("building a client for cluster {}", self.name), e))?;
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build::<_, Body>(https);
        Ok(ClientBuilder::new(http, config.default_namespace.clone())
            .with_layer(&config.base_uri_layer())
            .build())
    }

    // What can go wrong with it, on purpose: its API server stopped and
    // restarted, its address hung or cut off, a link of its own.
    /// Stops this API server alone (it is killed, as in a crash).
    ///
    /// Requests to it then fail with a connection error, while the other
    /// clusters of the fleet keep answering. Its data stays in etcd.
    pub fn stop(&self) {
        // Dropping the process kills and reaps it.
        drop(self.process().take());
    }

    /// Starts this API server again with the same address and credentials,
    /// and waits until it is ready. Stops it first if it runs.
    ///
    /// Existing clients and kubeconfigs keep working, and the cluster's data
    /// is as it was before [`stop`](Self::stop). A fault set with
    /// [`hang`](Self::hang) or [`cut_off`](Self::cut_off) stays in place: it
    /// is the network's, not the server's.
    pub async fn restart(&self) -> Result<()> {
        self.stop();
        self.run().await
    }

    /// Makes the cluster hang for every client: connections to it are
    /// accepted and kept open, but nothing is answered, and bytes stop
    /// flowing on the connections already open, so requests and watches
    /// stall without an error until [`restore`](Self::restore).
    ///
    /// This is a cluster whose network or API server has stalled; clients
    /// notice only through their own timeouts.
    ///
    /// ```no_run
    /// # async fn example() -> kube_multicluster_envtest::Result<()> {
    /// use std::time::Duration;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::{Api, api::ListParams};
    ///
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// let cluster = &fleet.clusters()[0];
    /// let config_maps: Api<ConfigMap> = Api::default_namespaced(cluster.client());
    /// let all = ListParams::default();
    ///
    /// cluster.hang();
    /// let list = tokio::time::timeout(Duration::from_secs(1), config_maps.list(&all));
    /// assert!(list.await.is_err(), "no answer");
    ///
    /// cluster.restore();
    /// config_maps.list(&all).await.expect("answers again");
    /// # Ok(())
    /// # }
    /// ```
    pub fn hang(&self) {
        self.proxy.set(Traffic::Hung);
    }

    /// Cuts the cluster off from every client: open connections are closed
    /// at once and new ones as soon as they are made, so requests fail
    /// quickly with a connection error until [`restore`](Self::restore).
    ///
    /// ```no_run
    /// # async fn example() -> kube_multicluster_envtest::Result<()> {
    /// use k8s_openapi::api::core::v1::Namespace;
    /// use kube::Api;
    ///
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// let cluster = &fleet.clusters()[0];
    /// let namespaces: Api<Namespace> = Api::all(cluster.client());
    ///
    /// cluster.cut_off();
    /// assert!(namespaces.get("default").await.is_err());
    /// cluster.restore();
    /// assert!(namespaces.get("default").await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn cut_off(&self) {
        self.proxy.set(Traffic::CutOff);
    }

    /// Ends a [`hang`](Self::hang) or [`cut_off`](Self::cut_off).
    ///
    /// Connections held during a hang carry on where they stopped, with no
    /// byte lost; clients whose connections were cut off make new ones.
    pub fn restore(&self) {
        self.proxy.set(Traffic::Flowing);
    }

    /// A link of its own to this cluster, which can fail while the cluster's
    /// other clients carry on. See [`FaultyLink`].
    ///
    /// Must be called within a Tokio runtime, like `Client::try_from`.
    pub fn link(&self) -> Result<FaultyLink> {
        FaultyLink::new(&self.name, self.proxy.addr(), &self.kubeconfig)
    }

    /// Installs CRDs into this cluster and waits until they are served; see
    /// [`install_crds`](crate::install_crds).
    ///
    /// A kube-derive `CustomResource` gives its CRD with `K::crd()`:
    ///
    /// ```no_run
    /// # async fn example(cluster: &kube_multicluster_envtest::TestCluster) -> kube_multicluster_envtest::Result<()> {
    /// use kube::{CustomResource, CustomResourceExt};
    /// use schemars::JsonSchema;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
    /// #[kube(group = "example.com", version = "v1", kind = "Widget", namespaced)]
    /// struct WidgetSpec { size: u32 }
    ///
    /// cluster.install_crds([Widget::crd()]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn install_crds(
        &self,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
    ) -> Result<()> {
        let label = format!("cluster {}", self.name());
        crate::crd::install(&self.client(), &label, crds, DEFAULT_START_TIMEOUT).await
    }
}

/// An address on 127.0.0.1.
fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}
