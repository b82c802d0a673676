use super::{client::slots, *};

const TOKEN: &str = "s3cr3t-t0ken";

/// A kubeconfig with contexts `good`, `exec`, `insecure`, `files`,
/// `no-cluster`, `no-user`, `plain` and a second `good`.
fn kubeconfig() -> String {
    format!(
        r#"
apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {{ server: "https://a.example.com:6443" }}
- name: insecure
  cluster: {{ server: "https://b.example.com", insecure-skip-tls-verify: true }}
- name: ca-file
  cluster: {{ server: "https://c.example.com", certificate-authority: /etc/ca.pem }}
- name: plain
  cluster: {{ server: "http://d.example.com" }}
users:
- name: token
  user: {{ token: {TOKEN} }}
- name: exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: get-token
      args: ["--token={TOKEN}"]
contexts:
- {{ name: good, context: {{ cluster: a, user: token }} }}
- {{ name: exec, context: {{ cluster: a, user: exec }} }}
- {{ name: insecure, context: {{ cluster: insecure, user: token }} }}
- {{ name: files, context: {{ cluster: ca-file, user: token }} }}
- {{ name: no-cluster, context: {{ cluster: gone, user: token }} }}
- {{ name: no-user, context: {{ cluster: a, user: gone }} }}
- {{ name: plain, context: {{ cluster: plain, user: token }} }}
- {{ name: good, context: {{ cluster: insecure, user: token }} }}
"#
    )
}

async fn outcomes(policy: &KubeconfigPolicy) -> Vec<(String, Result<String, String>)> {
    let parsed = parse(&kubeconfig(), "Secret fleet/edge").unwrap();
    configs(&parsed, "Secret fleet/edge", policy)
        .await
        .into_iter()
        .map(|(context, config)| {
            let config = config
                .map(|c| c.cluster_url.to_string())
                .map_err(|e| format!("{e} / {e:?}"));
            (context, config)
        })
        .collect()
}

#[tokio::test]
async fn by_default_only_plain_contexts_load_and_each_refusal_names_its_source() {
    let outcomes = outcomes(&KubeconfigPolicy::default()).await;
    let error = |context: &str| {
        outcomes
            .iter()
            .find(|(c, _)| c == context)
            .and_then(|(_, r)| r.clone().err())
            .unwrap_or_else(|| panic!("{context} should fail"))
    };
    assert_eq!(outcomes[0].0, "good");
    assert!(
        outcomes[0]
            .1
            .as_ref()
            .is_ok_and(|url| url.contains("a.example.com"))
    );
    for (context, says) in [
        ("exec", "exec credential plugin (command \"get-token\")"),
        ("exec", "allow_exec"),
        ("insecure", "insecure-skip-tls-verify"),
        ("files", "certificate-authority \"/etc/ca.pem\""),
        ("no-cluster", "cluster \"gone\""),
        ("no-user", "user \"gone\""),
        ("plain", "a server that is not https (http)"),
    ] {
        let error = error(context);
        assert!(error.starts_with("Secret fleet/edge: context"), "{error}");
        assert!(error.contains(says), "{context}: {error}");
    }
    let goods: Vec<_> = outcomes.iter().filter(|(c, _)| c == "good").collect();
    assert!(
        matches!(&goods[..], [(_, Ok(_)), (_, Err(e))] if e.contains("another context of that name comes first")),
        "{goods:?}"
    );
    for (_, outcome) in &outcomes {
        let text = format!("{outcome:?}");
        assert!(!text.contains(TOKEN), "a secret leaked: {text}");
    }
}

#[tokio::test]
async fn each_allowance_lets_its_context_through() {
    let policy = KubeconfigPolicy::default()
        .allow_exec()
        .allow_insecure_skip_tls_verify();
    let outcomes = outcomes(&policy).await;
    let ok = |context: &str| outcomes.iter().any(|(c, r)| c == context && r.is_ok());
    assert!(ok("good") && ok("exec") && ok("insecure"));
    assert!(!ok("files"), "local files are still refused");
    assert!(!ok("plain"), "plain HTTP is still refused");
    assert!(!ok("no-cluster") && !ok("no-user"));
}

#[test]
fn a_parse_error_gives_where_never_what() {
    for yaml in [
        format!("users:\n- name: u\n  user:\n    token: \"{TOKEN}\n"),
        format!("users:\n- name: u\n  user:\n    token: [{TOKEN}]\n"),
        format!(
            "users:\n- name: u\n  user:\n    exec:\n      command: x\n      interactiveMode: {TOKEN}\n"
        ),
    ] {
        let error = parse(&yaml, "Secret fleet/edge").unwrap_err();
        let text = format!("{error} / {error:?}");
        assert!(!text.contains(TOKEN), "a secret leaked: {text}");
        assert!(text.contains("line"), "{text}");
    }
}

#[test]
fn a_kubeconfig_without_contexts_is_malformed() {
    for yaml in ["", "hello: world", "current-context: x"] {
        let error = parse(yaml, "Secret fleet/edge").unwrap_err().to_string();
        assert!(error.ends_with("defines no context"), "{yaml:?}: {error}");
    }
}

#[test]
fn malformed_text_is_reported_with_its_source() {
    let error = parse("clusters: [ {", "file /tmp/broken.yaml").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("file /tmp/broken.yaml: not a kubeconfig:"),
        "{error}"
    );
}

#[test]
fn a_file_s_relative_paths_are_taken_from_its_directory() {
    let dir = std::env::temp_dir().join(format!("kubeconfig-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet.kubeconfig");
    std::fs::write(
            &path,
            r#"
clusters:
- name: a
  cluster: { server: "https://a.example.com", certificate-authority: ca.crt }
users:
- name: u
  user: { tokenFile: /abs/token, exec: { command: ./bin/login, apiVersion: client.authentication.k8s.io/v1 } }
contexts:
- name: a
  context: { cluster: a, user: u }
"#,
        )
        .unwrap();
    let read = read_file(&path).unwrap();
    let cluster = read.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        dir.join("ca.crt").to_str()
    );
    let user = read.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(user.token_file.as_deref(), Some("/abs/token"));
    assert_eq!(
        user.exec.as_ref().unwrap().command.as_deref(),
        dir.join("./bin/login").to_str()
    );
    let missing = read_file(&dir.join("nothing")).unwrap_err();
    assert!(matches!(missing, KubeconfigError::Unreadable { .. }));
    assert!(missing.to_string().contains("nothing"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_current_context_is_the_named_one_or_the_only_one() {
    let mut parsed = parse(&kubeconfig(), "test").unwrap();
    let many = current_context(&parsed, "test").unwrap_err();
    assert!(many.to_string().contains("no current-context"), "{many}");
    parsed.current_context = Some("exec".into());
    assert_eq!(current_context(&parsed, "test").unwrap(), "exec");
    parsed.current_context = Some("gone".into());
    assert!(current_context(&parsed, "test").is_err());
    parsed.current_context = None;
    parsed.contexts.truncate(1);
    assert_eq!(current_context(&parsed, "test").unwrap(), "good");
}

#[test]
fn a_fingerprint_changes_with_the_entries_a_context_uses_only() {
    let parsed = parse(&kubeconfig(), "test").unwrap();
    let before = fingerprint(&parsed, "good").unwrap();
    assert_eq!(fingerprint(&parsed, "good"), Some(before));
    assert_eq!(fingerprint(&parsed, "nothing"), None);
    let mut other_changed = parsed.clone();
    other_changed.clusters[1].cluster.as_mut().unwrap().server = Some("https://c".into());
    assert_eq!(fingerprint(&other_changed, "good"), Some(before));
    let mut own_changed = parsed.clone();
    own_changed.clusters[0].cluster.as_mut().unwrap().server = Some("https://c".into());
    assert_ne!(fingerprint(&own_changed, "good"), Some(before));
}

#[tokio::test]
async fn a_failing_credential_plugin_is_reported_without_its_command_line_or_output() {
    let yaml = r#"
clusters:
- name: a
  cluster: { server: "https://127.0.0.1:1" }
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: sh
      args: ["-c", "echo out-SECRET-1; echo err-SECRET-2 >&2; exit 1", "arg-SECRET-3"]
      env: [{ name: PASSWORD, value: env-SECRET-4 }]
      interactiveMode: Never
contexts:
- name: a
  context: { cluster: a, user: u }
"#;
    let parsed = parse(yaml, "test").unwrap();
    let policy = KubeconfigPolicy::default().allow_exec();
    let (_, config) = configs(&parsed, "test", &policy).await.remove(0);
    let Err(error) = client(config.unwrap(), "test", "a").await else {
        panic!("a client despite a failing plugin");
    };
    let text = format!("{error} {error:?}");
    assert!(text.contains("credentials could not be obtained"), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
}

#[test]
fn a_context_alone_holds_its_entries_only() {
    let parsed = parse(&kubeconfig(), "test").unwrap();
    let alone = only(&parsed, "good").unwrap();
    assert_eq!(alone.contexts.len(), 1);
    assert_eq!(alone.clusters.len(), 1);
    assert_eq!(alone.auth_infos.len(), 1);
    assert_eq!(alone.current_context.as_deref(), Some("good"));
    assert!(only(&parsed, "nothing").is_none());
}

/// A plugin that works at first, with a token that has expired, then
/// fails: the refresh's error reaches requests (and so the watches'
/// logs and status), and says nothing of the command, env or output.
#[tokio::test]
async fn a_plugin_failing_at_refresh_is_reported_without_its_secrets() {
    let dir = std::env::temp_dir().join(format!("kubeconfig-refresh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ran = dir.join("ran");
    let script = format!(
        "echo x >> {m}; if [ $(wc -l < {m}) -gt 1 ]; then echo out-SECRET-1; echo err-SECRET-2 >&2; exit 1; fi; \
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\",\"expirationTimestamp\":\"2000-01-01T00:00:00Z\"}}}}'",
        m = ran.display()
    );
    let yaml = format!(
        r#"
clusters:
- name: a
  cluster: {{ server: "https://127.0.0.1:1" }}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: sh
      args: ["-c", {script:?}, "arg-SECRET-3"]
      env: [{{ name: PASSWORD, value: env-SECRET-4 }}]
contexts:
- name: a
  context: {{ cluster: a, user: u }}
"#
    );
    let parsed = parse(&yaml, "test").unwrap();
    let policy = KubeconfigPolicy::default().allow_exec();
    let (_, config) = configs(&parsed, "test", &policy).await.remove(0);
    let Ok(client) = client(config.unwrap(), "test", "a").await else {
        panic!("the first runs work");
    };
    let error = client.into_client().apiserver_version().await.unwrap_err();
    let text = crate::client::error_chain(&error);
    assert!(text.contains("credentials could not be obtained"), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn one_build_at_a_time_for_a_source_however_many_tries_wait() {
    let dir = std::env::temp_dir().join(format!("kube-multicluster-turns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    let plugin = dir.join("plugin");
    std::fs::write(
            &plugin,
            format!(
                "#!/bin/sh\necho start >> '{log}'\nsleep 1\necho end >> '{log}'\n\
                 echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"t\"}}}}'\n",
                log = log.display()
            ),
        )
        .unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let yaml = format!(
        r#"{{"apiVersion": "v1", "kind": "Config",
              "clusters": [{{"name": "a", "cluster": {{"server": "https://a.example.com"}}}}],
              "users": [{{"name": "a", "user": {{"exec": {{"apiVersion": "client.authentication.k8s.io/v1", "command": "{}"}}}}}}],
              "contexts": [{{"name": "a", "context": {{"cluster": "a", "user": "a"}}}}]}}"#,
        plugin.display()
    );
    let parsed = parse(&yaml, "Secret x/turns").unwrap();
    let policy = KubeconfigPolicy::default().allow_exec();
    let (first, second) = tokio::join!(
        current_client(&parsed, "Secret x/turns", &policy),
        current_client(&parsed, "Secret x/turns", &policy),
    );
    assert!(first.is_ok() && second.is_ok());
    let runs = std::fs::read_to_string(&log).unwrap();
    assert!(runs.lines().count() >= 4, "{runs}");
    assert!(
        !runs.contains("start\nstart"),
        "two plugins ran at once: {runs}"
    );
    assert!(slots().is_empty(), "a turn kept after its builds ended");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_secret_gives_the_bytes_of_a_key_that_is_there_and_not_empty() {
    use k8s_openapi::{ByteString, api::core::v1::Secret};
    let secret = Secret {
        data: Some(
            [("full", &b"abc"[..]), ("empty", b"")]
                .map(|(key, value)| (key.to_owned(), ByteString(value.to_vec())))
                .into(),
        ),
        ..Secret::default()
    };
    assert_eq!(secret_bytes(&secret, "full").as_deref(), Some(&b"abc"[..]));
    assert_eq!(secret_bytes(&secret, "empty"), None);
    assert_eq!(secret_bytes(&secret, "missing"), None);
    assert_eq!(secret_bytes(&Secret::default(), "full"), None);
}
