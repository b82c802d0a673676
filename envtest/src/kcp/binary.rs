//! Finding, or building once and caching, the `kcp` binary.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::{
    Binaries, Error, Result,
    assets::{found_once, go_build},
};

/// The kcp release the harness builds.
pub const KCP_VERSION: &str = "v0.28.0";
/// Environment variable naming a `kcp` binary to run instead of building one.
pub const KCP_ENV: &str = "KCP_BINARY";

const GO_MOD: &str = include_str!("../../go-kcp/go.mod");
const GO_SUM: &str = include_str!("../../go-kcp/go.sum");

/// Where the harness finds `kcp`: the file `KCP_BINARY` names, else its
/// cache beside the API servers', else built once with the machine's `go`
/// (a few minutes) and cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KcpBinary {
    /// Path of the `kcp` executable.
    pub path: PathBuf,
}

impl KcpBinary {
    /// Finds the binary, building it on first use; remembered for the rest
    /// of the process, and built once between processes that start at once.
    pub async fn find() -> Result<Self> {
        static FOUND: OnceLock<KcpBinary> = OnceLock::new();
        found_once(&FOUND, "the kcp lookup task failed", Self::find_blocking).await
    }

    /// The directory the built binary is cached in.
    pub fn cache_dir() -> PathBuf {
        let apiservers = Binaries::cache_dir();
        let root = apiservers.parent().unwrap_or(&apiservers);
        root.join(format!("kcp-{KCP_VERSION}"))
    }

    fn find_blocking() -> Result<Self> {
        if let Some(path) = std::env::var_os(KCP_ENV).filter(|p| !p.is_empty()) {
            let path = PathBuf::from(path);
            if !path.is_file() {
                return Err(Error::MissingBinaries(format!(
                    "{KCP_ENV} names {}, which is not a file",
                    path.display()
                )));
            }
            return Ok(Self { path });
        }
        let dir = Self::cache_dir();
        let path = dir.join("kcp");
        if !path.is_file() {
            build(&dir)?;
        }
        Ok(Self { path })
    }
}

fn build(dir: &Path) -> Result<()> {
    go_build(
        dir,
        &format!("kcp {KCP_VERSION}"),
        |go_version| {
            go_version.map_err(|e| {
                Error::MissingBinaries(format!(
                    "kcp is needed to run a kcp server, and `go` could not be run ({e}); install Go, or set {KCP_ENV} to a kcp {KCP_VERSION} binary"
                ))
            })
        },
        &[("go.mod", GO_MOD), ("go.sum", GO_SUM)],
        &["-ldflags", "-s -w", "github.com/kcp-dev/kcp/cmd/kcp"],
        &["kcp"],
    )
}
