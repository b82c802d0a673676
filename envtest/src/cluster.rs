//! One test cluster: a `kube-apiserver` process, its credentials and a client.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{
    Error, Result,
    kubeconfig::admin_kubeconfig,
    pki::Pki,
    process::{Process, free_port},
};

/// One API server of an [`Envtest`](crate::Envtest) fleet.
///
/// It hands out what a test needs to talk to the cluster: a ready
/// [`Client`], an admin kubeconfig in memory and on disk, and
/// [`stop`](Self::stop) / [`restart`](Self::restart) of this API server alone.
/// Its data lives in the fleet's etcd, so it survives a restart.
///
/// ```no_run
/// # async fn example() -> kube_fleet_envtest::Result<()> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{Api, api::ListParams};
///
/// let fleet = kube_fleet_envtest::Envtest::start(2).await?;
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
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    process: Mutex<Option<Process>>,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    client: Client,
    timeout: Duration,
}

impl std::fmt::Debug for TestCluster {
    // The kubeconfig holds the admin key; only say where it is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("name", &self.name)
            .field("server", &self.server())
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
}

impl TestCluster {
    pub(crate) async fn start(name: &str, placement: Placement<'_>) -> Result<Self> {
        let Placement {
            binary,
            etcd_url,
            etcd_prefix,
            dir,
            timeout,
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
        let ca = file("ca.crt", &pki.ca_cert)?;
        let serving_cert = file("apiserver.crt", &pki.serving_cert)?;
        let serving_key = file("apiserver.key", &pki.serving_key)?;
        let sa_key = file("sa.key", &pki.service_account_key)?;
        let sa_pub = file("sa.pub", &pki.service_account_pub)?;

        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            let server = format!("https://127.0.0.1:{port}");
            let args = vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--etcd-prefix={etcd_prefix}"),
                "--bind-address=127.0.0.1".to_owned(),
                "--advertise-address=127.0.0.1".to_owned(),
                format!("--secure-port={port}"),
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
            ];
            let kubeconfig = admin_kubeconfig(name, &server, &pki);
            let kubeconfig_path = dir.join("kubeconfig");
            let yaml = serde_saphyr::to_string(&kubeconfig).map_err(|e| {
                Error::io(
                    format!("serialising the kubeconfig of cluster {name}"),
                    std::io::Error::other(e),
                )
            })?;
            fs::write(&kubeconfig_path, yaml)
                .map_err(|e| Error::io(format!("writing {}", kubeconfig_path.display()), e))?;
            let config =
                Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
                    .await
                    .map_err(|source| Error::Kubeconfig {
                        cluster: name.to_owned(),
                        source,
                    })?;
            let client = Client::try_from(config)
                .map_err(|e| Error::kube(format!("building a client for cluster {name}"), e))?;
            let cluster = Self {
                name: name.to_owned(),
                binary: binary.to_owned(),
                args,
                process: Mutex::new(None),
                kubeconfig,
                kubeconfig_path,
                client,
                timeout,
            };
            match cluster.run().await {
                Err(Error::Exited { .. }) if attempt < 3 && cluster.lost_port_race() => {}
                other => return other.map(|()| cluster),
            }
        }
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

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        self.kubeconfig.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.as_deref())
            .unwrap_or_default()
    }

    /// The process id of the running API server, or `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.process().as_ref().map(Process::pid)
    }

    /// Stops this API server alone (it is killed, as in a crash).
    ///
    /// Requests to it then fail with a connection error, while the other
    /// clusters of the fleet keep answering. Its data stays in etcd.
    pub fn stop(&self) {
        // Dropping the process kills and reaps it.
        drop(self.process().take());
    }

    /// Starts this API server again on the same address with the same
    /// credentials, and waits until it is ready. Stops it first if it runs.
    ///
    /// Existing clients and kubeconfigs keep working, and the cluster's data
    /// is as it was before [`stop`](Self::stop).
    pub async fn restart(&self) -> Result<()> {
        self.stop();
        self.run().await
    }

    fn process(&self) -> MutexGuard<'_, Option<Process>> {
        // A panic while the lock was held cannot leave the option half-written.
        self.process.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lost_port_race(&self) -> bool {
        self.process().as_ref().is_some_and(Process::lost_port_race)
    }

    /// Starts the process and waits until `/readyz` answers and the `default`
    /// namespace exists.
    async fn run(&self) -> Result<()> {
        let process = Process::spawn(
            format!("kube-apiserver of cluster {}", self.name),
            &self.binary,
            &self.args,
            self.kubeconfig_path.with_file_name("kube-apiserver.log"),
        )?;
        *self.process() = Some(process);

        let started = Instant::now();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let mut last_error = None;
        while started.elapsed() < self.timeout {
            let exited = self.process().as_mut().and_then(Process::exit_error);
            if let Some(exited) = exited {
                return Err(exited);
            }
            let readyz = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request is valid");
            match self.client.request_text(readyz).await {
                Ok(_) => match namespaces.get_opt("default").await {
                    Ok(Some(_)) => return Ok(()),
                    Ok(None) => last_error = Some("namespace default does not exist yet".into()),
                    Err(e) => last_error = Some(e.to_string()),
                },
                Err(e) => last_error = Some(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Timeout {
            what: format!("kube-apiserver of cluster {}", self.name),
            after: self.timeout,
            last_error,
        })
    }
}
