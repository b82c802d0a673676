//! Finding the binaries: what a user sees when they are missing.

use std::process::Command;

const CLI: &str = env!("CARGO_BIN_EXE_kube-multicluster-envtest");

#[test]
fn without_go_or_assets_the_error_says_how_to_provide_them() {
    let cache = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = Command::new(CLI)
        .arg("install")
        .env_remove("KUBEBUILDER_ASSETS")
        .env("KUBE_MULTICLUSTER_ENVTEST_CACHE", cache.path())
        .env("PATH", empty_path.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`go` could not be run"), "{stderr}");
    assert!(stderr.contains("install Go"), "{stderr}");
    assert!(stderr.contains("set KUBEBUILDER_ASSETS"), "{stderr}");
    assert!(
        stderr.contains(&cache.path().display().to_string()),
        "{stderr}"
    );
}

#[test]
fn assets_dir_without_binaries_is_named_in_the_error() {
    let assets = tempfile::tempdir().unwrap();
    std::fs::write(assets.path().join("etcd"), "").unwrap();
    let out = Command::new(CLI)
        .arg("install")
        .env("KUBEBUILDER_ASSETS", assets.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&assets.path().display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.contains("no executable `kube-apiserver`"),
        "{stderr}"
    );
}

#[test]
fn assets_dir_with_both_binaries_is_used_as_is() {
    let assets = tempfile::tempdir().unwrap();
    for binary in ["kube-apiserver", "etcd"] {
        std::fs::write(assets.path().join(binary), "").unwrap();
    }
    let out = Command::new(CLI)
        .arg("install")
        .env("KUBEBUILDER_ASSETS", assets.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        assets.path().display().to_string()
    );
}

/// A harness process killed outright (SIGKILL: no destructor runs) takes its
/// API servers and etcd with it.
#[test]
#[cfg(target_os = "linux")]
fn a_killed_harness_process_leaves_no_server_behind() {
    use std::{
        io::{BufRead, BufReader},
        path::Path,
        process::Stdio,
        time::{Duration, Instant},
    };

    let mut harness = Command::new(CLI)
        .args(["start", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    let mut kubeconfig = None;
    for line in BufReader::new(harness.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(path) = line.split('\t').nth(2) {
            kubeconfig = Some(std::path::PathBuf::from(path));
        }
        if let Some(list) = line.strip_prefix("pids\t") {
            pids = list.split(' ').map(|p| p.parse::<u32>().unwrap()).collect();
            break;
        }
    }
    assert_eq!(pids.len(), 2, "etcd and one API server");
    let alive = |pid: &u32| Path::new(&format!("/proc/{pid}")).exists();
    assert!(pids.iter().all(alive));

    harness.kill().unwrap(); // SIGKILL
    harness.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(alive) {
        // A dead child is reaped by init; until then it is a zombie in /proc.
        let zombies = pids.iter().filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.split(' ').nth(2) == Some("Z"))
        });
        if zombies.count() == pids.iter().filter(|p| alive(p)).count() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes {pids:?} outlived the harness"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // No destructor ran, so the fleet's directory (etcd's data among it) is
    // still there: the test removes it, as an operator would.
    let cluster_dir = kubeconfig.as_deref().and_then(Path::parent).unwrap();
    let fleet_dir = cluster_dir.parent().unwrap();
    assert!(fleet_dir.join("etcd").is_dir(), "{}", fleet_dir.display());
    std::fs::remove_dir_all(fleet_dir).unwrap();
}
