//! Finding the binaries: what a user sees when they are missing.

use std::process::Command;

const CLI: &str = env!("CARGO_BIN_EXE_kube-fleet-envtest");

#[test]
fn without_go_or_assets_the_error_says_how_to_provide_them() {
    let cache = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let out = Command::new(CLI)
        .arg("install")
        .env_remove("KUBEBUILDER_ASSETS")
        .env("KUBE_FLEET_ENVTEST_CACHE", cache.path())
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
