//! A kcp server for tests: one shard with its embedded etcd on loopback,
//! its admin kubeconfig, and helpers to make workspaces, an APIExport and
//! its bindings.

mod binary;

pub use binary::{KCP_ENV, KCP_VERSION, KcpBinary};

use std::{
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use tempfile::TempDir;

use crate::{
    Error, Result,
    process::{Deadline, Process, free_port},
};

/// An APIExport `example.io` of a namespaced `Widget`
/// (`widgets.example.io`, any fields) with its APIResourceSchema, claiming
/// ConfigMaps: what tests bind ([`Kcp::apply`] it, then [`Kcp::bind`]).
pub const KCP_EXAMPLE_EXPORT: &str = include_str!("../../kcp/export.yaml");

/// How long kcp may take to start and to bootstrap its root workspace.
pub const KCP_START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running kcp server; stopped (and its directory removed) when dropped.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// let kcp = kube_multicluster_envtest::Kcp::start().await?;
/// let name = kcp.create_workspace("tenant-a").await?; // its logical cluster
/// let tenant = kcp.client("root:tenant-a").await?;
/// # let _ = (name, tenant);
/// # Ok(())
/// # }
/// ```
pub struct Kcp {
    /// An admin client of the server's base URL, whose connection every
    /// workspace's client shares.
    admin: OnceLock<Client>,
    // Dropped first: the server, then its directory.
    process: Process,
    base: String,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    dir: TempDir,
}

impl std::fmt::Debug for Kcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kcp")
            .field("base", &self.base)
            .field("pid", &self.process.pid())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl Kcp {
    /// Builds kcp if needed ([`KcpBinary::find`]), starts it, and waits
    /// until its root workspace takes new workspaces (its `root` and
    /// `universal` WorkspaceTypes are there).
    pub async fn start() -> Result<Self> {
        let binary = KcpBinary::find().await?;
        for last in [false, false, true] {
            if let Some(kcp) = Self::launch(&binary, last).await? {
                return Ok(kcp);
            }
        }
        unreachable!("the last attempt gives kcp or an error")
    }

    /// Starts kcp on ports free now; `None` if another process took one of
    /// them in the meantime (kcp exits), unless this is the `last` attempt.
    async fn launch(binary: &KcpBinary, last: bool) -> Result<Option<Self>> {
        let dir = tempfile::Builder::new()
            .prefix("kube-multicluster-kcp-")
            .tempdir()
            .map_err(|e| Error::io("creating kcp's temporary directory", e))?;
        let (port, etcd_client, etcd_peer) = (free_port()?, free_port()?, free_port()?);
        let root = dir.path().join("root");
        let args = vec![
            "start".to_owned(),
            format!("--root-directory={}", root.display()),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--embedded-etcd-client-port={etcd_client}"),
            format!("--embedded-etcd-peer-port={etcd_peer}"),
        ];
        let mut process = Process::spawn(
            format!("kcp on port {port}"),
            &binary.path,
            &args,
            dir.path().join("kcp.log"),
        )?;
        let kubeconfig_path = root.join("admin.kubeconfig");
        let started = Instant::now();
        let interval = Duration::from_millis(200);
        let deadline = Deadline::new(
            "kcp's admin kubeconfig",
            started,
            KCP_START_TIMEOUT,
            interval,
        );
        let kubeconfig = loop {
            if let Some(error) = process.exit_error() {
                let retry = process.lost_port_race() && !last;
                return if retry { Ok(None) } else { Err(error) };
            }
            if let Ok(kubeconfig) = Kubeconfig::read_from(&kubeconfig_path) {
                break kubeconfig;
            }
            deadline.not_yet(None).await?;
        };
        let kcp = Self {
            admin: OnceLock::new(),
            process,
            base: format!("https://127.0.0.1:{port}"),
            kubeconfig,
            kubeconfig_path,
            dir,
        };
        // Bootstrapped once the root workspace type exists.
        let root = kcp.client("root").await?;
        let types = objects(root, "tenancy.kcp.io/v1alpha1", "WorkspaceType");
        let (what, interval) = ("kcp's root workspace", Duration::from_millis(250));
        let deadline = Deadline::new(what, started, KCP_START_TIMEOUT, interval);
        loop {
            // Workspaces under root are of the type universal by default.
            let (root, universal) = (
                types.get_opt("root").await,
                types.get_opt("universal").await,
            );
            let missing = "the root and universal WorkspaceTypes are not there yet";
            let why = match (root, universal) {
                (Ok(Some(_)), Ok(Some(_))) => break,
                (Err(error), _) | (_, Err(error)) => error.to_string(),
                _ => missing.to_owned(),
            };
            deadline.not_yet(Some(why)).await?;
        }
        Ok(Some(kcp))
    }

    /// The server's base URL (`https://127.0.0.1:PORT`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The admin kubeconfig kcp wrote (contexts `root`, `base`,
    /// `system:admin`).
    pub fn kubeconfig_path(&self) -> &std::path::Path {
        &self.kubeconfig_path
    }

    /// kcp's own process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// An admin client of the workspace at `path` (`root`, `root:tenant-a`)
    /// or of a logical cluster by name.
    pub async fn client(&self, path: &str) -> Result<Client> {
        let admin = match self.admin.get() {
            Some(admin) => admin.clone(),
            None => {
                let admin = self.client_at(&self.base).await?;
                self.admin.get_or_init(|| admin).clone()
            }
        };
        // Its requests' paths under the workspace's, over the admin's
        // connection.
        let prefix = format!("/clusters/{path}");
        let send = tower::service_fn(move |mut request: http::Request<kube::client::Body>| {
            let (admin, prefix) = (admin.clone(), prefix.clone());
            async move {
                let path = request
                    .uri()
                    .path_and_query()
                    .map_or("/", |path| path.as_str());
                *request.uri_mut() = format!("{prefix}{path}").parse::<http::Uri>()?;
                admin.send(request).await.map_err(tower::BoxError::from)
            }
        });
        Ok(Client::new(send, "default"))
    }

    /// An admin client of any URL kcp serves, such as an APIExport's
    /// virtual workspace.
    pub async fn client_at(&self, url: &str) -> Result<Client> {
        let config = self.config_at(url).await?;
        Client::try_from(config).map_err(|e| Error::kube(format!("a client of {url}"), e))
    }

    /// The admin `kube::Config` of the workspace at `path` (`root:tenant-a`).
    pub async fn config(&self, path: &str) -> Result<kube::Config> {
        self.config_at(&format!("{}/clusters/{path}", self.base))
            .await
    }

    /// The admin `kube::Config` of any URL kcp serves.
    pub async fn config_at(&self, url: &str) -> Result<kube::Config> {
        self.config_as("base", url).await
    }

    /// The server's own metrics (`GET /metrics`, as the shard's
    /// `system:admin`, which may read them): how many watches it serves,
    /// say (`apiserver_longrunning_requests`).
    pub async fn metrics(&self) -> Result<String> {
        let config = self.config_as("system:admin", &self.base).await?;
        let client =
            Client::try_from(config).map_err(|e| Error::kube("a client of kcp's metrics", e))?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::io("a request of kcp's metrics", std::io::Error::other(e)))?;
        client
            .request_text(request)
            .await
            .map_err(|e| Error::kube("reading kcp's metrics", e))
    }

    async fn config_as(&self, context: &str, url: &str) -> Result<kube::Config> {
        let options = KubeConfigOptions {
            context: Some(context.into()),
            ..KubeConfigOptions::default()
        };
        let mut config = kube::Config::from_custom_kubeconfig(self.kubeconfig.clone(), &options)
            .await
            .map_err(|source| Error::Kubeconfig {
                cluster: "kcp".into(),
                source,
            })?;
        config.cluster_url = url.parse().map_err(|e| {
            Error::io(
                format!("kcp URL {url}"),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })?;
        Ok(config)
    }

    /// Creates the workspace `name` under `root` (an organization), waits
    /// until it is ready, and returns its logical cluster's name.
    pub async fn create_workspace(&self, name: &str) -> Result<String> {
        let root = self.client("root").await?;
        let workspaces = objects(root, "tenancy.kcp.io/v1alpha1", "Workspace");
        let workspace: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1",
            "kind": "Workspace",
            "metadata": {"name": name},
        }))
        .expect("a valid Workspace");
        workspaces
            .patch(
                name,
                &PatchParams::apply(crate::FIELD_MANAGER),
                &Patch::Apply(&workspace),
            )
            .await
            .map_err(|e| Error::kube(format!("creating kcp workspace {name}"), e))?;
        let interval = Duration::from_millis(200);
        let what = format!("kcp workspace {name}");
        let deadline = Deadline::new(what, Instant::now(), KCP_START_TIMEOUT, interval);
        loop {
            let current = workspaces
                .get(name)
                .await
                .map_err(|e| Error::kube(format!("reading kcp workspace {name}"), e))?;
            let phase = current.data["status"]["phase"].as_str().unwrap_or_default();
            if let Some(cluster) = current.data["spec"]["cluster"].as_str()
                && phase == "Ready"
            {
                return Ok(cluster.to_owned());
            }
            deadline.not_yet(Some(format!("phase {phase:?}"))).await?;
        }
    }

    /// Applies `yaml` (documents separated by `---`) in the workspace at
    /// `path`, each object by server-side apply.
    pub async fn apply(&self, path: &str, yaml: &str) -> Result<()> {
        let client = self.client(path).await?;
        let documents: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(yaml).map_err(|source| Error::CrdParse { source })?;
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            let object: DynamicObject = serde_json::from_value(document)
                .map_err(|source| Error::CrdDecode { index: 0, source })?;
            let types = object.types.clone().unwrap_or_default();
            let api = objects(client.clone(), &types.api_version, &types.kind);
            let name = object.metadata.name.clone().unwrap_or_default();
            api.patch(
                &name,
                &PatchParams::apply(crate::FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| {
                Error::kube(
                    format!("applying {} {name} in kcp workspace {path}", types.kind),
                    e,
                )
            })?;
        }
        Ok(())
    }

    /// The URLs of an APIExport's endpoint slice (the export's virtual
    /// workspace on each shard), once it has one: kcp writes them once a
    /// workspace binds the export.
    pub async fn endpoints(&self, path: &str, export: &str) -> Result<Vec<String>> {
        let client = self.client(path).await?;
        let slices = objects(client, "apis.kcp.io/v1alpha1", "APIExportEndpointSlice");
        let interval = Duration::from_millis(200);
        let what = format!("the endpoints of APIExport {export}");
        let deadline = Deadline::new(what, Instant::now(), KCP_START_TIMEOUT, interval);
        loop {
            let slice = slices
                .get_opt(export)
                .await
                .map_err(|e| Error::kube(format!("reading the endpoint slice {export}"), e))?;
            let urls: Vec<String> = slice
                .iter()
                .flat_map(|slice| slice.data["status"]["endpoints"].as_array())
                .flatten()
                .filter_map(|endpoint| endpoint["url"].as_str().map(str::to_owned))
                .collect();
            if !urls.is_empty() {
                return Ok(urls);
            }
            deadline.not_yet(None).await?;
        }
    }

    /// How many watches of `resource` kcp serves now, by its own
    /// `apiserver_longrunning_requests` ([`metrics`](Self::metrics)). A
    /// watch through an APIExport's virtual workspace counts twice: as the
    /// virtual workspace serves it, and as the watch it opens on the shard.
    pub async fn watches_served(&self, resource: &str) -> Result<u64> {
        Ok(crate::metrics::watches_served(
            &self.metrics().await?,
            resource,
        ))
    }

    /// Binds the APIExport `export` of the workspace at `export_path` in the
    /// workspace at `path` (an `APIBinding` named after the export),
    /// accepting (`true`) or rejecting (`false`) each of its permission
    /// claims, named `resource` for the core group or `resource.group`.
    ///
    /// ```no_run
    /// # async fn example(kcp: kube_multicluster_envtest::Kcp) -> kube_multicluster_envtest::Result<()> {
    /// kcp.create_workspace("provider").await?;
    /// kcp.create_workspace("tenant-a").await?;
    /// kcp.apply("root:provider", kube_multicluster_envtest::KCP_EXAMPLE_EXPORT).await?;
    /// kcp.bind("root:tenant-a", "root:provider", "example.io", &[("configmaps", true)]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn bind(
        &self,
        path: &str,
        export_path: &str,
        export: &str,
        claims: &[(&str, bool)],
    ) -> Result<()> {
        let claims: Vec<serde_json::Value> = claims
            .iter()
            .map(|(claim, accepted)| {
                let (resource, group) = claim.split_once('.').unwrap_or((claim, ""));
                serde_json::json!({
                    "group": group,
                    "resource": resource,
                    "verbs": ["*"],
                    "selector": {"matchAll": true},
                    "state": if *accepted { "Accepted" } else { "Rejected" },
                })
            })
            .collect();
        let binding = serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha2",
            "kind": "APIBinding",
            "metadata": {"name": export},
            "spec": {
                "reference": {"export": {"path": export_path, "name": export}},
                "permissionClaims": claims,
            },
        });
        self.apply(path, &binding.to_string()).await
    }

    /// kcp's directory (its data and log).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// The objects of `kind` in `api_version` through `client`, whose plural is
/// the kind in lower case with an `s`.
fn objects(client: Client, api_version: &str, kind: &str) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = format!("{}s", kind.to_lowercase());
    Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, &plural))
}
