//! Finding, or building once and caching, the `kube-apiserver` and `etcd` binaries.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::{Error, Result, process::log_tail};

/// The Kubernetes release whose `kube-apiserver` the harness builds.
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// The etcd release that Kubernetes release was tested with, which the harness builds.
pub const ETCD_VERSION: &str = "v3.6.8";

/// Environment variable naming a directory that already holds both binaries.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Environment variable that overrides where built binaries are cached.
pub const CACHE_ENV: &str = "KUBE_MULTICLUSTER_ENVTEST_CACHE";

// The wrapper Go module, embedded so that the build works from wherever the
// harness is compiled or run.
const GO_FILES: [(&str, &str); 3] = [
    ("go.mod", include_str!("../go/go.mod")),
    ("go.sum", include_str!("../go/go.sum")),
    ("etcd/main.go", include_str!("../go/etcd/main.go")),
];

/// Where the harness finds `kube-apiserver` and `etcd`.
///
/// [`Binaries::find`] looks, in order, at the directory in `KUBEBUILDER_ASSETS`
/// (filled by controller-runtime's `setup-envtest`, for instance), then at its
/// own cache, and otherwise builds both binaries from the Go module proxy with
/// the machine's `go` and caches them for later runs.
///
/// ```no_run
/// # async fn example() -> kube_multicluster_envtest::Result<()> {
/// let binaries = kube_multicluster_envtest::Binaries::find().await?;
/// println!("kube-apiserver at {}", binaries.kube_apiserver.display());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// Path of the `kube-apiserver` executable.
    pub kube_apiserver: PathBuf,
    /// Path of the `etcd` executable.
    pub etcd: PathBuf,
}

impl Binaries {
    /// Finds the binaries, building them on first use; see the type's docs.
    ///
    /// The answer is remembered for the rest of the process. A build holds a
    /// file lock in the cache directory, so test binaries that start at once
    /// build only once between them and the others wait for it.
    pub async fn find() -> Result<Self> {
        static FOUND: OnceLock<Binaries> = OnceLock::new();
        found_once(&FOUND, "the binary lookup task failed", Self::find_blocking).await
    }

    /// The binaries in a directory, such as the one `KUBEBUILDER_ASSETS` names.
    pub fn in_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let binary = |binary: &'static str| {
            let path = dir.join(binary);
            if path.is_file() {
                Ok(path)
            } else {
                Err(Error::MissingAsset {
                    dir: dir.to_owned(),
                    binary,
                })
            }
        };
        Ok(Self {
            kube_apiserver: binary("kube-apiserver")?,
            etcd: binary("etcd")?,
        })
    }

    /// The directory where built binaries of the pinned versions are cached.
    ///
    /// `KUBE_MULTICLUSTER_ENVTEST_CACHE` if set, otherwise `kube-multicluster/envtest` in the
    /// user's cache directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux), with
    /// one subdirectory per pair of versions.
    pub fn cache_dir() -> PathBuf {
        let root = std::env::var_os(CACHE_ENV)
            .map(PathBuf::from)
            .or_else(|| dirs::cache_dir().map(|d| d.join("kube-multicluster").join("envtest")))
            .unwrap_or_else(|| std::env::temp_dir().join("kube-multicluster-envtest"));
        root.join(format!("k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"))
    }

    fn find_blocking() -> Result<Self> {
        if let Some(dir) = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty()) {
            return Self::in_dir(dir);
        }
        let dir = Self::cache_dir();
        if let Ok(found) = Self::in_dir(&dir) {
            return Ok(found);
        }
        build(&dir)?;
        Self::in_dir(&dir)
    }
}

fn missing_binaries(dir: &Path, why: &str) -> Error {
    Error::MissingBinaries(format!(
        "kube-apiserver and etcd are needed to run test clusters, and {why}. Provide them in one \
         of two ways:\n  \
         - install Go 1.21 or newer (https://go.dev/dl/) and put `go` on PATH: the harness then \
         builds kube-apiserver {KUBERNETES_VERSION} and etcd {ETCD_VERSION} once from the Go \
         module proxy (a few minutes) and caches them in {}\n  \
         - or set {ASSETS_ENV} to a directory holding both binaries, for example the one \
         `setup-envtest use -p path` prints",
        dir.display()
    ))
}

/// Builds both binaries into `dir`, unless another process did so while this
/// one waited for the lock.
fn build(dir: &Path) -> Result<()> {
    let ldflags = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION} \
         -X k8s.io/component-base/version.gitMajor=1 \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/component-base/version.gitTreeState=clean",
        minor = KUBERNETES_VERSION.split('.').nth(1).unwrap_or_default()
    );
    go_build(
        dir,
        &format!("kube-apiserver {KUBERNETES_VERSION} and etcd {ETCD_VERSION}"),
        |go_version| {
            let why = match go_version {
                Ok(version) if version.status.success() => return Ok(version),
                Ok(version) => format!("`go version` failed ({})", version.status),
                Err(e) => format!("`go` could not be run ({e})"),
            };
            Err(missing_binaries(dir, &why))
        },
        &GO_FILES,
        &[
            "-ldflags",
            &ldflags,
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "./etcd",
        ],
        &["kube-apiserver", "etcd"],
    )
}

/// Builds `binaries`, of `what`, into the cache directory `dir` with the
/// machine's `go`, unless another process did so while this one waited for
/// the lock: `files` make a Go module in `dir/src`, and `go build` runs
/// there with the flags and packages `args`. `go_version` checks what
/// `go version` gave before the build begins.
pub(crate) fn go_build(
    dir: &Path,
    what: &str,
    go_version: impl FnOnce(std::io::Result<Output>) -> Result<Output>,
    files: &[(&str, &str)],
    args: &[&str],
    binaries: &[&str],
) -> Result<()> {
    let names = binaries.join(" and ");
    let _lock = lock_cache_dir(dir, &names)?;
    if binaries.iter().all(|binary| dir.join(binary).is_file()) {
        return Ok(());
    }
    let go_version = go_version(Command::new("go").arg("version").output())?;
    let src = dir.join("src");
    for (name, text) in files {
        let path = src.join(name);
        fs::create_dir_all(path.parent().expect("a file in src has a parent"))
            .and_then(|()| fs::write(&path, text))
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    }
    let out = dir.join("build");
    let log = dir.join("build.log");
    let started = Instant::now();
    progress(format_args!(
        "building {what} with {} (first run only, a few minutes); log: {}",
        String::from_utf8_lossy(&go_version.stdout).trim(),
        log.display()
    ));
    let out_arg = format!("{}/", out.display());
    let build = [&["build", "-trimpath", "-o", &out_arg][..], args].concat();
    for (step, args) in [
        ("mod download", &["mod", "download"][..]),
        ("build", &build),
    ] {
        run_go(what, &src, &log, step, args, started)?;
    }
    for binary in binaries {
        let (from, to) = (out.join(binary), dir.join(binary));
        fs::rename(&from, &to)
            .map_err(|e| Error::io(format!("moving {} to {}", from.display(), to.display()), e))?;
    }
    progress(format_args!(
        "built {names} in {}; cached in {}",
        elapsed(started),
        dir.display()
    ));
    Ok(())
}

/// What `find` found, remembered in `found` for the rest of the process:
/// found once, on a blocking thread (a build takes minutes), and cloned
/// after.
pub(crate) async fn found_once<T: Clone + Send + Sync + 'static>(
    found: &'static OnceLock<T>,
    what_failed: &'static str,
    find: fn() -> Result<T>,
) -> Result<T> {
    if let Some(found) = found.get() {
        return Ok(found.clone());
    }
    let first = tokio::task::spawn_blocking(find)
        .await
        .map_err(|e| Error::io(what_failed, std::io::Error::other(e)))??;
    Ok(found.get_or_init(|| first).clone())
}

/// Makes the cache directory `dir` and locks it for a build of `what`,
/// waiting (and saying so) while another process builds there: the lock
/// holds until the file it returns is dropped.
fn lock_cache_dir(dir: &Path, what: &str) -> Result<fs::File> {
    fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating cache directory {}", dir.display()), e))?;
    let lock_path = dir.join(".lock");
    let lock = fs::File::create(&lock_path)
        .map_err(|e| Error::io(format!("creating lock file {}", lock_path.display()), e))?;
    if lock.try_lock().is_err() {
        progress(format_args!(
            "another process is building {what}; waiting for it ({})",
            lock_path.display()
        ));
        lock.lock()
            .map_err(|e| Error::io(format!("locking {}", lock_path.display()), e))?;
    }
    Ok(lock)
}

/// Runs one `go` step of building `what`, appending its output to `log`
/// and reporting progress on stderr until it ends.
fn run_go(
    what: &str,
    src: &Path,
    log: &Path,
    step: &str,
    args: &[&str],
    started: Instant,
) -> Result<()> {
    let log_file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::io(format!("opening build log {}", log.display()), e))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| Error::io(format!("opening build log {}", log.display()), e))?;
    let mut command = Command::new("go");
    command
        .args(args)
        .current_dir(src)
        .env("GOWORK", "off")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("CGO_ENABLED", "0")
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    if std::env::var_os("GOTOOLCHAIN").is_none() {
        // An older `go` fetches the toolchain the module asks for from the proxy.
        command.env("GOTOOLCHAIN", "auto");
    }
    let mut child = command.spawn().map_err(|e| Error::io("running `go`", e))?;
    progress(format_args!("step: go {step}"));
    let mut last_report = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(Error::io(format!("waiting for `go {step}`"), e)),
        }
        if last_report.elapsed() >= Duration::from_secs(30) {
            progress(format_args!(
                "still at step `go {step}`, {} elapsed",
                elapsed(started)
            ));
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if status.success() {
        return Ok(());
    }
    Err(Error::Build {
        what: format!("{what} (step `go {step}`)"),
        status,
        log: log.to_owned(),
        tail: log_tail(log, 30),
    })
}

/// Writes a line to the process's real stderr, past the test harness's
/// output capture, so that a long first build shows what it is doing.
fn progress(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "envtest: {message}");
}

fn elapsed(since: Instant) -> String {
    let secs = since.elapsed().as_secs();
    format!("{}m{:02}s", secs / 60, secs % 60)
}
