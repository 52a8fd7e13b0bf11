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

// ---------------------------------------------------------------------------------------------
// The reconciler's leadership: one leader at a time, elected through an etcd lease; takeover
// when the leader dies; a paused (deposed) leader stops acting.
//
// Every server runs libvirt's test driver on its own `test:///<abs>/node.xml` connection, and
// each process's test driver keeps its domains in its own memory: a domain the first leader
// started is not visible to the next one. What "no domain is started twice" means here is
// therefore checked through the log, which all servers share: each VMI is launched once and
// observed Running once, and a VM the old leader ran is not launched again by the new one.

/// The lease of these tests: short, so takeover is quick, but above etcd's minimum.
const LEASE_SECS: u64 = 2;

fn node_file(dir: &std::path::Path) -> String {
    let path = dir.join("node.xml");
    std::fs::write(&path, "<node></node>").expect("write the test driver's node file");
    format!("node1=test://{}", path.display())
}

fn leader_args<'a>(endpoints: &'a str, prefix: &'a str, hypervisor: &'a str) -> Vec<&'a str> {
    vec![
        "--backend",
        "etcd",
        "--etcd-endpoints",
        endpoints,
        "--etcd-prefix",
        prefix,
        "--hypervisor",
        hypervisor,
        "--leader-lease-seconds",
        "2",
    ]
}

/// How many times `server` printed that it started leading.
fn terms_led(server: &Server) -> usize {
    server
        .stderr()
        .lines()
        .filter(|l| l.contains("vmplane: reconciler: leading"))
        .count()
}

fn wait_until(what: &str, timeout: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn running_vm(name: &str, strategy: &str) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}"}},"spec":{{"runStrategy":"{strategy}","template":{{"spec":{{"domain":{{"memory":{{"guest":"64Mi"}},"devices":{{}}}}}}}}}}}}"#
    )
}

fn apply_cli(server: &Server, manifest: &str) {
    let (code, out, err) = Cli::new(server).run_with_stdin(&["apply", "-f", "-"], manifest);
    assert_eq!(code, 0, "apply failed: {out}{err}");
}

/// The VMI phase `get vmi NAME -o json` shows on `server`, if the VMI exists.
fn vmi_phase(server: &Server, name: &str) -> Option<String> {
    let (code, out, _) = Cli::new(server).run(&["get", "vmi", name, "-o", "json"]);
    if code != 0 {
        return None;
    }
    let v: Value = serde_json::from_str(&out).ok()?;
    v["status"]["phase"].as_str().map(str::to_owned)
}

/// The log's audit (every event, in order), read through `server`.
fn audit(server: &Server) -> Vec<Value> {
    let out = Cli::new(server).ok(&["audit", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).expect("audit json");
    match v {
        Value::Array(items) => items,
        other => other["items"].as_array().cloned().unwrap_or_default(),
    }
}

/// Events of VM `name` of type `event` (the VM's stream holds its VMIs' launches and the
/// reconciler's observations).
fn events_of<'a>(audit: &'a [Value], name: &str, event: &str) -> Vec<&'a Value> {
    audit
        .iter()
        .filter(|e| e["name"] == name && e["event"] == event)
        .collect()
}

fn signal(server: &Server, signal: libc::c_int) {
    // SAFETY: kill(2) on a child process this test started.
    let rc = unsafe { libc::kill(server.pid() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({}, {signal})", server.pid());
}

#[test]
fn killing_the_leading_server_hands_reconciling_to_another_within_the_lease() {
    let cluster =
        EtcdCluster::start(3).expect("a 3-member etcd cluster (run scripts/install-etcd.sh)");
    let endpoints = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let hypervisor = node_file(dir.path());
    let args = leader_args(&endpoints, "e2e-takeover", &hypervisor);
    let a = Server::start(&dir.path().join("a"), &args);
    wait_until("the first server leads", secs(15), || terms_led(&a) == 1);
    let b = Server::start(&dir.path().join("b"), &args);
    let c = Server::start(&dir.path().join("c"), &args);
    // Standbys stay standbys while the leader lives (a few lease periods).
    std::thread::sleep(secs(3 * LEASE_SECS));
    assert_eq!(
        (terms_led(&a), terms_led(&b), terms_led(&c)),
        (1, 0, 0),
        "exactly one leader"
    );

    // The leader runs a VM (written through another server: any server accepts writes).
    apply_cli(&b, &running_vm("before", "Once"));
    wait_until("VM before runs", secs(30), || {
        vmi_phase(&c, "before").as_deref() == Some("Running")
    });

    // SIGKILL the leader; a standby takes over within the lease (plus its poll).
    signal(&a, libc::SIGKILL);
    let killed = std::time::Instant::now();
    apply_cli(&b, &running_vm("after", "Always"));
    wait_until("a standby takes over", secs(LEASE_SECS + 3), || {
        terms_led(&b) + terms_led(&c) == 1
    });
    let takeover = killed.elapsed();
    eprintln!(
        "takeover {} ms after SIGKILL (lease {LEASE_SECS} s)",
        takeover.as_millis()
    );
    assert!(
        takeover <= secs(LEASE_SECS) + std::time::Duration::from_millis(1500),
        "takeover took {takeover:?} with a {LEASE_SECS} s lease"
    );
    // The new leader reconciles: the VM written after the kill runs.
    wait_until("VM after runs", secs(30), || {
        vmi_phase(&b, "after").as_deref() == Some("Running")
    });
    std::thread::sleep(secs(2 * LEASE_SECS));
    assert_eq!(
        terms_led(&b) + terms_led(&c),
        1,
        "one new leader, no flapping:\nB:\n{}\nC:\n{}",
        b.stderr(),
        c.stderr()
    );

    // Through the log: every VMI launched once, and the old leader's VM not launched again.
    let log = audit(&b);
    let launches = events_of(&log, "before", "VmiLaunched");
    assert_eq!(launches.len(), 1, "VM before launched once: {log:#?}");
    assert_eq!(
        events_of(&log, "after", "VmiLaunched").len(),
        1,
        "VM after launched once: {log:#?}"
    );
    for name in ["before", "after"] {
        let running: Vec<_> = events_of(&log, name, "VmiPhaseObserved")
            .into_iter()
            .filter(|e| e["summary"].as_str().unwrap_or("").contains("Running"))
            .collect();
        assert_eq!(
            running.len(),
            1,
            "{name}: one Running observation: {log:#?}"
        );
    }
    for e in &log {
        assert!(
            e["actor"] == "local" || e["actor"] == "system:reconciler",
            "unexpected actor: {e}"
        );
    }

    // A clean shutdown resigns: the last standby leads at once, well before a lease expiry.
    let (leader, standby) = if terms_led(&b) == 1 { (b, c) } else { (c, b) };
    let stopped = std::time::Instant::now();
    let status = leader.terminate(secs(30));
    assert!(status.success(), "SIGTERM exits cleanly: {status}");
    wait_until(
        "the standby takes over after a resign",
        secs(LEASE_SECS),
        || terms_led(&standby) == 1,
    );
    eprintln!(
        "handover {} ms after SIGTERM (the leader resigned)",
        stopped.elapsed().as_millis()
    );
}

#[test]
fn a_paused_leader_is_deposed_and_cannot_act_when_it_resumes() {
    let cluster =
        EtcdCluster::start(3).expect("a 3-member etcd cluster (run scripts/install-etcd.sh)");
    let endpoints = cluster.endpoints().join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let hypervisor = node_file(dir.path());
    let args = leader_args(&endpoints, "e2e-paused", &hypervisor);
    let a = Server::start(&dir.path().join("a"), &args);
    wait_until("the first server leads", secs(15), || terms_led(&a) == 1);
    let b = Server::start(&dir.path().join("b"), &args);
    apply_cli(&b, &running_vm("early", "Once"));
    wait_until("VM early runs", secs(30), || {
        vmi_phase(&b, "early").as_deref() == Some("Running")
    });

    // Pause the leader past its lease: B takes over while A does not know.
    signal(&a, libc::SIGSTOP);
    wait_until(
        "B takes over from the paused leader",
        secs(LEASE_SECS + 3),
        || terms_led(&b) == 1,
    );
    // B reconciles; in A's own test driver, VM late has no domain, and VM early's domain does
    // (A started it), while in B's driver it does not.
    apply_cli(&b, &running_vm("late", "Once"));
    wait_until("VM late runs", secs(30), || {
        vmi_phase(&b, "late").as_deref() == Some("Running")
    });
    let before_resume = audit(&b).len();

    // A resumes: it learns its term is over, stops its reconciler and stands by.
    signal(&a, libc::SIGCONT);
    wait_until("A notices it was deposed", secs(10), || {
        a.stderr().contains("reconciler: stopped (term")
    });
    let stderr = a.stderr();
    assert!(
        stderr.contains("leadership lost"),
        "A says why it stopped:\n{stderr}"
    );
    // Give A's reconciler every chance to act (resync, wake-ups): it must not write.
    std::thread::sleep(secs(3 * LEASE_SECS));
    assert_eq!(terms_led(&a), 1, "A did not lead again:\n{}", a.stderr());
    assert_eq!(terms_led(&b), 1, "B still leads:\n{}", b.stderr());
    let log = audit(&b);
    let after_resume: Vec<&Value> = log[before_resume..]
        .iter()
        .filter(|e| e["actor"] == "system:reconciler")
        .collect();
    assert!(
        after_resume.is_empty(),
        "no reconciler wrote after A resumed (B had nothing left to do; A must not act): \
         {after_resume:#?}"
    );
    assert_eq!(vmi_phase(&b, "late").as_deref(), Some("Running"));
    assert_eq!(events_of(&log, "late", "VmiLaunched").len(), 1);
    assert_eq!(events_of(&log, "early", "VmiLaunched").len(), 1);
}

fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}
