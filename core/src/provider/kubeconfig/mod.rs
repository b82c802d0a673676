//! Kubeconfigs from sources a provider does not control: parsed, checked
//! against a [`KubeconfigPolicy`], and turned into one `kube::Config` per
//! context, with errors that name where the kubeconfig came from.
//!
//! A kubeconfig can make the process that loads it run a command (an `exec`
//! credential plugin), call an `auth-provider` plugin, trust any server
//! (`insecure-skip-tls-verify`) or read files on the machine it runs on
//! (`certificate-authority`, `client-key`, `tokenFile`, ...), and it can
//! send credentials to a server over plain `http://`. From a file you wrote,
//! that is what you want; from a Secret, or a directory another party writes
//! to, it hands whoever writes there a way in. So the default policy refuses
//! all five, and a provider that reads such sources asks its user to allow
//! each one that is needed. This is stricter than kube in two ways: a context
//! that names a user the kubeconfig does not define is refused, and so is a
//! `certificate-authority` file next to `certificate-authority-data`.
//!
//! Errors name the source and the context, and the command, plugin or file
//! that was refused, never a token, a key or a command's arguments.
//!
//! ```
//! use kube_multicluster::provider::kubeconfig::{self, KubeconfigPolicy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let yaml = r#"
//! apiVersion: v1
//! kind: Config
//! clusters:
//! - name: east
//!   cluster: { server: "https://east.example.com:6443" }
//! users:
//! - name: robot
//!   user: { token: "not-logged" }
//! contexts:
//! - name: east
//!   context: { cluster: east, user: robot }
//! "#;
//! let parsed = kubeconfig::parse(yaml, "Secret fleet/east")?;
//! for (context, config) in kubeconfig::configs(&parsed, "Secret fleet/east", &KubeconfigPolicy::default()).await {
//!     let config = config?;
//!     assert_eq!(context, "east");
//!     assert_eq!(config.cluster_url.host(), Some("east.example.com"));
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod error;
mod parse;
mod policy;
#[cfg(test)]
mod tests;

pub use client::{CLIENT_TIMEOUT, bytes_client, client, configs, current_client};
pub use error::KubeconfigError;
pub use parse::{
    current_context, fingerprint, only, parse, parse_bytes, parse_file, read_file, secret_bytes,
};
pub use policy::{KubeconfigPolicy, check};
