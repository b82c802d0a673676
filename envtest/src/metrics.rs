//! Reading an API server's own metrics: how many watches and lists it
//! serves, which tests compare before and after.

/// The sum of the series of `metric` in the Prometheus text `metrics` (an
/// API server's `GET /metrics`) for `resource`, and for `verb` unless it is
/// empty.
///
/// ```
/// let text = r#"apiserver_longrunning_requests{resource="configmaps",scope="cluster",verb="WATCH"} 2
/// apiserver_longrunning_requests{resource="configmaps",scope="namespace",verb="WATCH"} 1
/// apiserver_longrunning_requests{resource="secrets",scope="cluster",verb="WATCH"} 5"#;
/// assert_eq!(kube_multicluster_envtest::metric_sum(text, "apiserver_longrunning_requests", "configmaps", "WATCH"), 3);
/// assert_eq!(kube_multicluster_envtest::watches_served(text, "secrets"), 5);
/// ```
pub fn metric_sum(metrics: &str, metric: &str, resource: &str, verb: &str) -> u64 {
    let series = format!("{metric}{{");
    let resource = format!("resource=\"{resource}\"");
    let verb = if verb.is_empty() {
        String::new()
    } else {
        format!("verb=\"{verb}\"")
    };
    metrics
        .lines()
        .filter(|line| line.starts_with(&series))
        .filter(|line| line.contains(&resource) && line.contains(&verb))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// How many watches of `resource` an API server serves now, by its
/// `apiserver_longrunning_requests` in `metrics`.
pub fn watches_served(metrics: &str, resource: &str) -> u64 {
    metric_sum(metrics, "apiserver_longrunning_requests", resource, "WATCH")
}
