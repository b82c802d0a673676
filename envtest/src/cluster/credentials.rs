//! Who else may talk to a test cluster: a service account's token, a
//! credential plugin, any user and groups.

use std::{fs, path::Path};

use kube::{Api, Client, config::Kubeconfig};

use crate::{Error, Result, kubeconfig};

use super::TestCluster;

impl TestCluster {
    /// A token of the service account `account` in the `default`
    /// namespace, made a cluster admin (a `ClusterRoleBinding` of the same
    /// name to `cluster-admin`), good for an hour: a bearer token for tests
    /// of token credentials, such as a credential plugin that prints it.
    /// The account and binding are made if they are not there.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// let token = fleet.clusters()[0].admin_token("fleet").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn admin_token(&self, account: &str) -> Result<String> {
        use k8s_openapi::api::{
            authentication::v1::{TokenRequest, TokenRequestSpec},
            core::v1::ServiceAccount,
            rbac::v1::{ClusterRoleBinding, RoleRef, Subject},
        };
        use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};

        let failed = |what: &str| {
            let what = format!(
                "{what} for service account {account} in cluster {}",
                self.name
            );
            move |e| Error::kube(what, e)
        };
        let apply = PatchParams::apply(crate::FIELD_MANAGER).force();
        let accounts = Api::<ServiceAccount>::namespaced(self.client(), "default");
        let metadata = ObjectMeta {
            name: Some(account.to_owned()),
            ..ObjectMeta::default()
        };
        let service_account = ServiceAccount {
            metadata: metadata.clone(),
            ..ServiceAccount::default()
        };
        accounts
            .patch(account, &apply, &Patch::Apply(&service_account))
            .await
            .map_err(failed("making the account"))?;
        let binding = ClusterRoleBinding {
            metadata,
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "ClusterRole".to_owned(),
                name: "cluster-admin".to_owned(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: account.to_owned(),
                namespace: Some("default".to_owned()),
                ..Subject::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(self.client())
            .patch(account, &apply, &Patch::Apply(&binding))
            .await
            .map_err(failed("binding cluster-admin"))?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let issued = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .map_err(failed("requesting a token"))?;
        Ok(issued
            .status
            .map(|s| s.token)
            .unwrap_or_default()
            .unwrap_or_default())
    }

    /// The admin kubeconfig with its credentials handed out by an exec
    /// credential plugin: a shell script, written beside the kubeconfig
    /// file, that runs `before` (any shell text: `sleep 3`, `exit 1`,
    /// `echo $$ >> runs`) and then prints an `ExecCredential` holding the
    /// admin's client certificate.
    ///
    /// It is for tests of what a program does with slow, failing or
    /// counted plugins; a program must allow exec plugins to use it. Each
    /// call writes a new script.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// // A plugin that takes two seconds to answer.
    /// let slow = fleet.clusters()[0].exec_kubeconfig("sleep 2")?;
    /// let config = kube::Config::from_custom_kubeconfig(slow, &Default::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn exec_kubeconfig(&self, before: &str) -> Result<Kubeconfig> {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicUsize, Ordering};

        static PLUGINS: AtomicUsize = AtomicUsize::new(0);
        let n = PLUGINS.fetch_add(1, Ordering::Relaxed);
        let dir = self.kubeconfig_path.with_file_name(format!("plugin-{n}"));
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating directory {}", dir.display()), e))?;
        let admin = self
            .ca
            .client_certificate(&format!("{}-admin", self.name), &["system:masters"])?;
        let credential = kubeconfig::exec_credential(&admin);
        let credential_path = dir.join("credential.json");
        let write = |path: &Path, text: &str| {
            fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
        };
        write(&credential_path, &credential.to_string())?;
        let plugin = dir.join("plugin");
        write(
            &plugin,
            &format!("#!/bin/sh\n{before}\ncat '{}'\n", credential_path.display()),
        )?;
        fs::set_permissions(&plugin, fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io(format!("making {} executable", plugin.display()), e))?;
        Ok(kubeconfig::with_exec(
            &self.kubeconfig,
            &plugin.display().to_string(),
        ))
    }

    /// A kubeconfig for `user` in `groups`, with a client certificate signed
    /// by this cluster's CA (CN `user`, an O for each group) inline.
    ///
    /// The API server takes the user and groups from the certificate as they
    /// are; what they may do is up to RBAC. The group `system:masters` may do
    /// anything, and `system:authenticated` is added to every user.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// let kubeconfig = fleet.clusters()[0].kubeconfig_for("alice", &["developers"])?;
    /// std::fs::write("alice.kubeconfig", serde_json::to_string(&kubeconfig)?)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<Kubeconfig> {
        let credentials = self.ca.client_certificate(user, groups)?;
        Ok(kubeconfig::kubeconfig(
            &self.name,
            self.server(),
            &self.ca,
            user,
            &credentials,
        ))
    }

    /// A client for `user` in `groups`, from
    /// [`kubeconfig_for`](Self::kubeconfig_for).
    ///
    /// Must be called within a Tokio runtime, like `Client::try_from`.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::{Api, api::ListParams};
    ///
    /// let fleet = kube_multicluster_envtest::Envtest::start(1).await?;
    /// let alice = fleet.clusters()[0].client_for("alice", &[])?;
    /// let err = Api::<ConfigMap>::default_namespaced(alice)
    ///     .list(&ListParams::default())
    ///     .await
    ///     .unwrap_err();
    /// assert!(matches!(err, kube::Error::Api(status) if status.code == 403));
    /// # Ok(())
    /// # }
    /// ```
    pub fn client_for(&self, user: &str, groups: &[&str]) -> Result<Client> {
        kubeconfig::client(self.kubeconfig_for(user, groups)?, &self.name)
    }
}
