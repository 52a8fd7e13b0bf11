//! Applies to objects whose state the server does not hold in memory: after a restart its
//! state cache is empty, so each apply has its stream read back from the log (queued for a few
//! blocking drainers, `vmplane_gateway::loads`) before it is decided. Many at once, on both
//! embedded backends: every one is applied once, with the next generation, and reads show it.

use std::time::Duration;

use vmplane_gateway::pb::{self, objects_client::ObjectsClient};
use vmplane_tests::Server;

use crate::{channel, rt};

const VMS: usize = 96;

fn vm(i: usize, memory_mi: u32) -> String {
    format!(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: cold-{i}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        memory:
          guest: {memory_mi}Mi
        devices: {{}}
"
    )
}

/// Applies every VM at `memory_mi`, all at once; the outcomes and generations, in VM order.
async fn apply_all(server: &Server, memory_mi: u32) -> Vec<(String, u64)> {
    let channel = channel(server).await;
    let tasks: Vec<_> = (0..VMS)
        .map(|i| {
            let mut client = ObjectsClient::new(channel.clone());
            tokio::spawn(async move {
                let request = pb::ApplyRequest {
                    manifest: vm(i, memory_mi),
                    namespace: "cold".into(),
                    ..Default::default()
                };
                // A read left waiting in the queue would hold its apply forever.
                let answer = tokio::time::timeout(Duration::from_secs(60), client.apply(request))
                    .await
                    .unwrap_or_else(|_| panic!("apply cold-{i}: no answer within 60 s"))
                    .unwrap_or_else(|e| panic!("apply cold-{i}: {e}"))
                    .into_inner();
                let generation = answer.object.as_ref().map_or(0, |o| o.generation);
                (answer.outcome, generation)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("apply task"));
    }
    outcomes
}

fn updates_after_a_restart_read_their_states_back(backend: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let args = ["--hypervisor", "none", "--backend", backend];
    let rt = rt();
    {
        let server = Server::start(&data, &args);
        let created = rt.block_on(apply_all(&server, 128));
        assert!(
            created.iter().all(|(o, g)| o == "created" && *g == 1),
            "{created:?}"
        );
    }
    let server = Server::start(&data, &args);
    let updated = rt.block_on(apply_all(&server, 256));
    for (i, (outcome, generation)) in updated.iter().enumerate() {
        assert_eq!(
            (outcome.as_str(), *generation),
            ("configured", 2),
            "cold-{i} on {backend}"
        );
    }
    // Applied once each: the same manifests again change nothing.
    let again = rt.block_on(apply_all(&server, 256));
    assert!(
        again.iter().all(|(o, g)| o == "unchanged" && *g == 2),
        "{again:?}"
    );
    let objects = rt.block_on(async {
        let mut client = ObjectsClient::new(channel(&server).await);
        client
            .list(pb::ListRequest {
                kind: "VirtualMachine".into(),
                namespace: "cold".into(),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner()
            .items
    });
    assert_eq!(objects.len(), VMS);
    for object in objects {
        let json: serde_json::Value = serde_json::from_str(&object.json).expect("json");
        assert_eq!(
            json["spec"]["template"]["spec"]["domain"]["memory"]["guest"], "256Mi",
            "{} on {backend}",
            object.name
        );
    }
}

#[test]
fn many_updates_at_once_after_a_restart_apply_once_each_on_the_file_log() {
    updates_after_a_restart_read_their_states_back("file");
}

#[test]
fn many_updates_at_once_after_a_restart_apply_once_each_on_sled() {
    updates_after_a_restart_read_their_states_back("sled");
}
