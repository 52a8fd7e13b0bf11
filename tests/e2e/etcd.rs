//! Several vmplane servers on one etcd cluster (`--backend etcd`): any server accepts writes,
//! each keeps its projections current from the shared log, and a read that passes the position
//! of a write made on another server waits for it. A real 3-member etcd cluster on loopback
//! ports, started by the harness (`scripts/install-etcd.sh` installs etcd).

use serde_json::Value;
use vmplane_gateway::pb::{self, objects_client::ObjectsClient};
use vmplane_store_etcd::harness::EtcdCluster;
use vmplane_tests::{Cli, Server};

fn vm(name: &str, memory: &str) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}"}},"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"memory":{{"guest":"{memory}"}},"devices":{{}}}}}}}}}}}}"#
    )
}

async fn apply(url: &str, manifest: String) -> pb::ApplyResponse {
    ObjectsClient::connect(url.to_string())
        .await
        .expect("connect")
        .apply(pb::ApplyRequest {
            manifest,
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .expect("apply")
        .into_inner()
}

async fn get(url: &str, name: &str, min_position: u64) -> pb::Object {
    ObjectsClient::connect(url.to_string())
        .await
        .expect("connect")
        .get(pb::GetRequest {
            r#ref: Some(pb::ObjectRef {
                kind: "vm".into(),
                namespace: "default".into(),
                name: name.into(),
            }),
            at: None,
            min_position,
        })
        .await
        .expect("get")
        .into_inner()
        .object
        .expect("an object")
}

#[test]
fn two_servers_on_one_etcd_cluster_serve_each_others_writes() {
    let cluster =
        EtcdCluster::start(3).expect("a 3-member etcd cluster (run scripts/install-etcd.sh)");
    let endpoints = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let args = [
        "--backend",
        "etcd",
        "--etcd-endpoints",
        endpoints.as_str(),
        "--hypervisor",
        "none",
    ];
    let a = Server::start(&dir.path().join("a"), &args);
    let b = Server::start(&dir.path().join("b"), &args);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // A write on A is read on B, once B's projections reached its position.
        let written = apply(&a.url, vm("shared-1", "128Mi")).await;
        assert_eq!(written.outcome, "created");
        let on_b = get(&b.url, "shared-1", written.position).await;
        let on_a = written.object.expect("object");
        assert_eq!(
            (on_b.uid.as_str(), on_b.generation, on_b.resource_version),
            (on_a.uid.as_str(), 1, written.position)
        );

        // A write on B, then an edit on A of the same object: one stream, one generation order.
        let second = apply(&b.url, vm("shared-2", "64Mi")).await;
        let edited = apply(&a.url, vm("shared-2", "96Mi")).await;
        assert_eq!(edited.outcome, "configured");
        assert!(
            edited.position > second.position,
            "positions are global and increase"
        );
        let seen = get(&b.url, "shared-2", edited.position).await;
        assert_eq!(seen.generation, 2);
        let v: Value = serde_json::from_str(&seen.json).expect("json");
        assert_eq!(
            v["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
            "96Mi"
        );
    });
    // Both list the same objects at the same position.
    let list = |s: &Server| -> Value {
        serde_json::from_str(&Cli::new(s).ok(&["get", "vms", "-o", "json"])).expect("list json")
    };
    let (la, lb) = (list(&a), list(&b));
    assert_eq!(la["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(la["items"], lb["items"]);
    // The audit trail is the same on every server: it is the log.
    assert_eq!(
        Cli::new(&a).ok(&["audit", "-o", "json"]),
        Cli::new(&b).ok(&["audit", "-o", "json"])
    );
}
