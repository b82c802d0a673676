//! Wire format: what a list of ConfigMaps costs the API server and the client
//! in JSON and in protobuf.
//!
//! ```text
//! cargo bench --bench wire_format              # 1,000 ConfigMaps, 200 lists each way
//! cargo bench --bench wire_format -- 5000 50   # other sizes: objects, lists
//! ```
//!
//! One envtest API server holds N ConfigMaps (one data key each). The bench
//! lists them M times in each format, alternating JSON and protobuf
//! (`Accept: application/vnd.kubernetes.protobuf`), from the API server's
//! watch cache (`resourceVersion=0`, so etcd is not involved), one list at a
//! time. Measured: the API server's and etcd's CPU per list (from `/proc`),
//! the bytes on the wire per list, and the client's time to decode a JSON
//! list into `ConfigMap`s (kube has no protobuf decoder to compare with).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Client, api::ObjectList};
use kube_multicluster::envtest::Envtest;
use tower::BoxError;

mod os;
mod setup;

use os::cpu_seconds;

const JSON: &str = "application/json";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

async fn list(client: &Client, accept: &str) -> Result<Vec<u8>, BoxError> {
    let request = http::Request::get("/api/v1/namespaces/default/configmaps?resourceVersion=0")
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())?;
    let response = client.send(request.map(Into::into)).await?;
    let status = response.status();
    let body = response.into_body().collect_bytes().await?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)).into());
    }
    Ok(body.to_vec())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<usize> = std::env::args().filter_map(|a| a.parse().ok()).collect();
    let objects = args.first().copied().unwrap_or(1_000);
    let lists = args.get(1).copied().unwrap_or(200);

    let env = Envtest::start(1).await?;
    let cluster = &env.clusters()[0];
    let client = kube_multicluster::client::client(setup::direct_config(cluster).await?)?;
    setup::fill(client.clone(), objects).await?;
    // Warm both paths (and the watch cache) up.
    for accept in [JSON, PROTOBUF] {
        list(&client, accept).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pids: Vec<String> = env.pids().iter().map(u32::to_string).collect();
    let servers = || pids.iter().map(|p| cpu_seconds(p)).sum::<f64>();
    let (mut cpu, mut bytes, mut decode) = ([0.0; 2], [0usize; 2], Duration::ZERO);
    for _ in 0..lists {
        for (i, accept) in [JSON, PROTOBUF].into_iter().enumerate() {
            let before = servers();
            let body = list(&client, accept).await?;
            cpu[i] += servers() - before;
            bytes[i] += body.len();
            if i == 0 {
                let began = Instant::now();
                let decoded: ObjectList<ConfigMap> = serde_json::from_slice(&body)?;
                decode += began.elapsed();
                assert_eq!(decoded.items.len(), objects);
            }
        }
    }
    let per = |x: f64| x / lists as f64;
    println!("{objects} ConfigMaps, {lists} lists in each format, from the watch cache");
    for (i, name) in ["JSON", "protobuf"].into_iter().enumerate() {
        println!(
            "  {name:<9} API server + etcd CPU {:.2} ms per list ({:.2} us per object); {:.0} KiB per list",
            per(cpu[i]) * 1e3,
            per(cpu[i]) * 1e6 / objects as f64,
            per(bytes[i] as f64) / 1024.0,
        );
    }
    println!(
        "  client: decoding a JSON list into ConfigMaps {:.2} ms ({:.2} us per object)",
        per(decode.as_secs_f64()) * 1e3,
        per(decode.as_secs_f64()) * 1e6 / objects as f64
    );
    Ok(())
}
