//! Crash-restart under load, end to end: the real server under a mixed workload from several
//! gRPC clients (creates, updates with an expected generation, deletes, starts and stops, and a
//! watch), killed with SIGKILL at random moments and restarted on the same data directory.
//! After every restart:
//!
//! - every acknowledged write is there: the audit has an entry for its object at its position,
//!   and an acknowledged apply reads back (time travel to its position) with the generation and
//!   the memory it wrote;
//! - positions have no gap: a watch from 0 sees exactly 1..=head;
//! - the projections equal a rebuild: every VM and VMI of the restarted server (which loaded its
//!   checkpoint) equals the same object served by a second server started on a copy of the data
//!   directory without the projections' checkpoint (a full replay).
//!
//! `VMPLANE_CRASH_CYCLES` sets the number of kills (default 50), `VMPLANE_CRASH_SEED` replays a
//! run. A thousand cycles:
//!
//! ```text
//! VMPLANE_CRASH_CYCLES=1000 cargo test -p vmplane-tests --test e2e crash_restart -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use vmplane_gateway::pb::{
    self, admin_client::AdminClient, history_client::HistoryClient,
    lifecycle_client::LifecycleClient, objects_client::ObjectsClient, watch_client::WatchClient,
};
use vmplane_tests::Server;

use crate::{channel, rt};

const WORKERS: usize = 3;
const NAMES: usize = 4;
/// Every how many cycles the projections are compared with a full rebuild (and at the end).
const REBUILD_EVERY: usize = 10;
/// Every how many cycles the server is stopped with SIGTERM instead (under load).
const CLEAN_STOP_EVERY: usize = 4;
const SERVER_ARGS: &[&str] = &["--hypervisor", "none"];

/// A small deterministic RNG (splitmix64): the test needs no dependency for it.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

pub fn vm_manifest(name: &str, memory_mi: u64) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}"}},
"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"memory":{{"guest":"{memory_mi}Mi"}},
"devices":{{}}}}}}}}}}}}"#
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// An apply that wrote generation `generation` with `memory` MiB.
    Apply {
        generation: u64,
        memory: u64,
    },
    Delete,
    Start,
    Stop,
}

/// One acknowledged write.
#[derive(Debug, Clone)]
struct Ack {
    cycle: usize,
    position: u64,
    namespace: String,
    name: String,
    op: Op,
}

fn vm_ref(ns: &str, name: &str) -> pb::ObjectRef {
    pb::ObjectRef {
        kind: "vm".into(),
        namespace: ns.into(),
        name: name.into(),
    }
}

/// One client of one cycle: writes VMs of its own namespace until the server dies. It is the
/// only writer of its namespace, so what it knows of its objects is exact, except for a write
/// whose answer the kill swallowed: it reads its objects back at the start of every cycle.
fn worker(url: String, id: usize, cycle: usize, seed: u64, killed: Arc<AtomicBool>) -> Vec<Ack> {
    rt().block_on(async move {
        let mut acks = Vec::new();
        let Ok(endpoint) = tonic::transport::Channel::from_shared(url) else {
            return acks;
        };
        let Ok(channel) = endpoint.connect().await else {
            return acks;
        };
        let mut objects = ObjectsClient::new(channel.clone());
        let mut lifecycle = LifecycleClient::new(channel);
        let ns = format!("crash-w{id}");
        let mut rng = Rng::new(seed);
        // name -> current generation (None: absent).
        let mut known: BTreeMap<String, Option<u64>> = BTreeMap::new();
        for n in 0..NAMES {
            let name = format!("vm-{n}");
            let got = objects
                .get(pb::GetRequest {
                    r#ref: Some(vm_ref(&ns, &name)),
                    ..Default::default()
                })
                .await;
            let generation = match got {
                Ok(r) => Some(r.into_inner().object.expect("object").generation),
                Err(s) if s.code() == Code::NotFound => None,
                Err(s) => {
                    assert!(
                        killed.load(Ordering::SeqCst),
                        "get {ns}/{name} failed while the server was up: {s}"
                    );
                    return acks;
                }
            };
            known.insert(name, generation);
        }
        loop {
            let name = format!("vm-{}", rng.range(0, NAMES as u64));
            let current = known[&name];
            let dice = rng.range(0, 100);
            let result: Result<(u64, Op), tonic::Status> = match current {
                None => {
                    let memory = rng.range(64, 4096);
                    objects
                        .apply(pb::ApplyRequest {
                            manifest: vm_manifest(&name, memory),
                            namespace: ns.clone(),
                            ..Default::default()
                        })
                        .await
                        .map(|r| {
                            let r = r.into_inner();
                            let generation = r.object.expect("object").generation;
                            (r.position, Op::Apply { generation, memory })
                        })
                }
                Some(generation) if dice < 55 => {
                    let memory = rng.range(64, 4096);
                    objects
                        .apply(pb::ApplyRequest {
                            manifest: vm_manifest(&name, memory),
                            namespace: ns.clone(),
                            expected_generation: Some(generation),
                            ..Default::default()
                        })
                        .await
                        .map(|r| {
                            let r = r.into_inner();
                            let generation = r.object.expect("object").generation;
                            (r.position, Op::Apply { generation, memory })
                        })
                }
                Some(generation) if dice < 70 => objects
                    .delete(pb::DeleteRequest {
                        r#ref: Some(vm_ref(&ns, &name)),
                        expected_generation: Some(generation),
                        request_id: String::new(),
                    })
                    .await
                    .map(|r| (r.into_inner().position, Op::Delete)),
                Some(_) => {
                    let request = pb::LifecycleRequest {
                        namespace: ns.clone(),
                        name: name.clone(),
                        request_id: String::new(),
                    };
                    if dice < 85 {
                        lifecycle
                            .start(request)
                            .await
                            .map(|r| (r.into_inner().position, Op::Start))
                    } else {
                        lifecycle
                            .stop(request)
                            .await
                            .map(|r| (r.into_inner().position, Op::Stop))
                    }
                }
            };
            match result {
                Ok((position, op)) => {
                    match op {
                        Op::Apply { generation, .. } => {
                            known.insert(name.clone(), Some(generation));
                        }
                        Op::Delete => {
                            known.insert(name.clone(), None);
                        }
                        // A start or stop of a halted VM changes its run strategy: read the
                        // generation back below, on the next update's conflict if any.
                        Op::Start | Op::Stop => {
                            let got = objects
                                .get(pb::GetRequest {
                                    r#ref: Some(vm_ref(&ns, &name)),
                                    min_position: position,
                                    ..Default::default()
                                })
                                .await;
                            match got {
                                Ok(r) => {
                                    known.insert(
                                        name.clone(),
                                        Some(r.into_inner().object.expect("object").generation),
                                    );
                                }
                                Err(s) => {
                                    assert!(killed.load(Ordering::SeqCst), "get after {op:?}: {s}");
                                }
                            }
                        }
                    }
                    acks.push(Ack {
                        cycle,
                        position,
                        namespace: ns.clone(),
                        name,
                        op,
                    });
                }
                // Stopping a stopped VM (or starting a started one) is refused, appending
                // nothing.
                Err(s) if s.code() == Code::FailedPrecondition && dice >= 70 => {}
                Err(s) => {
                    if killed.load(Ordering::SeqCst) {
                        return acks;
                    }
                    panic!(
                        "{ns}/{name}: {current:?} dice {dice}: refused while the server was up: {s}"
                    );
                }
            }
        }
    })
}

/// A watch from 0 during the load: what it delivered must be 1, 2, 3, ... without a gap or a
/// repeat, up to the kill.
fn watcher(url: String, killed: Arc<AtomicBool>) -> Vec<u64> {
    rt().block_on(async move {
        let mut seen = Vec::new();
        let Ok(channel) = tonic::transport::Channel::from_shared(url)
            .expect("url")
            .connect()
            .await
        else {
            return seen;
        };
        let Ok(stream) = WatchClient::new(channel)
            .watch(pb::WatchRequest {
                all_namespaces: true,
                from_position: Some(0),
                ..Default::default()
            })
            .await
        else {
            return seen;
        };
        let mut stream = stream.into_inner();
        loop {
            match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
                Ok(Ok(Some(ev))) => seen.push(ev.position),
                Ok(_) => return seen,
                Err(_) if killed.load(Ordering::SeqCst) => return seen,
                Err(_) => {}
            }
        }
    })
}

async fn head(server: &Server) -> u64 {
    AdminClient::new(channel(server).await)
        .log_info(pb::LogInfoRequest {})
        .await
        .expect("log info")
        .into_inner()
        .head_position
}

/// Every VM and VMI the server serves, keyed by (kind, namespace, name).
async fn everything(server: &Server) -> BTreeMap<(String, String, String), pb::Object> {
    let mut objects = ObjectsClient::new(channel(server).await);
    let mut all = BTreeMap::new();
    for kind in ["vm", "vmi"] {
        let list = objects
            .list(pb::ListRequest {
                kind: kind.into(),
                all_namespaces: true,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        for o in list.items {
            all.insert((o.kind.clone(), o.namespace.clone(), o.name.clone()), o);
        }
    }
    all
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The checks after a restart; `Err` names what is wrong.
fn check_restart(
    server: &Server,
    acks: &[Ack],
    fresh_from: usize,
    rng: &mut Rng,
) -> Result<(), String> {
    let rt = rt();
    rt.block_on(async {
        let head = head(server).await;
        // No gap: a watch from 0 sees 1..=head.
        let mut stream = WatchClient::new(channel(server).await)
            .watch(pb::WatchRequest {
                all_namespaces: true,
                from_position: Some(0),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("watch: {s}"))?
            .into_inner();
        let mut next = 1;
        while next <= head {
            let ev = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .map_err(|_| format!("watch from 0 stalled at {next} of {head}"))?
                .map_err(|s| format!("watch: {s}"))?
                .ok_or("watch ended")?;
            if ev.position != next {
                return Err(format!(
                    "watch from 0: expected {next}, got {}",
                    ev.position
                ));
            }
            next += 1;
        }
        // Every acknowledged write is in the audit at its position, for its object.
        let audit = HistoryClient::new(channel(server).await)
            .audit(pb::AuditRequest {
                all_namespaces: true,
                ..Default::default()
            })
            .await
            .map_err(|s| format!("audit: {s}"))?
            .into_inner()
            .entries;
        let by_position: BTreeMap<u64, &pb::AuditEntry> =
            audit.iter().map(|a| (a.position, a)).collect();
        let mut objects = ObjectsClient::new(channel(server).await);
        for (i, ack) in acks.iter().enumerate() {
            if ack.position > head {
                return Err(format!("{ack:?} is beyond the head {head}: lost"));
            }
            let Some(entry) = by_position.get(&ack.position) else {
                return Err(format!("{ack:?}: no audit entry at its position"));
            };
            if (entry.namespace.as_str(), entry.name.as_str())
                != (ack.namespace.as_str(), ack.name.as_str())
            {
                return Err(format!(
                    "{ack:?}: the audit entry at its position is {entry:?}"
                ));
            }
            // What it wrote: every apply of the last cycle, and a sample of older ones.
            let Op::Apply { generation, memory } = ack.op else {
                continue;
            };
            if i < fresh_from && rng.range(0, 10) != 0 {
                continue;
            }
            let got = objects
                .get(pb::GetRequest {
                    r#ref: Some(vm_ref(&ack.namespace, &ack.name)),
                    at: Some(pb::PointInTime {
                        at: Some(pb::point_in_time::At::Position(ack.position)),
                    }),
                    min_position: 0,
                })
                .await
                .map_err(|s| format!("{ack:?}: get at its position: {s}"))?
                .into_inner()
                .object
                .ok_or("no object")?;
            let wrote = format!("\"{memory}Mi\"");
            if got.generation != generation || !got.json.contains(&wrote) {
                return Err(format!(
                    "{ack:?}: read back generation {} json {}",
                    got.generation, got.json
                ));
            }
        }
        Ok(())
    })
}

/// The served projections equal a full replay of a copy of the log (without the checkpoint).
fn check_rebuild(
    server: &Server,
    data: &Path,
    scratch: &Path,
    args: &[&str],
) -> Result<usize, String> {
    let copy = scratch.join("rebuild");
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(data, &copy);
    let _ = std::fs::remove_dir_all(copy.join("projections"));
    let rebuilt = Server::start(&copy, args);
    let rt = rt();
    let (served, replayed) =
        rt.block_on(async { (everything(server).await, everything(&rebuilt).await) });
    drop(rebuilt);
    let _ = std::fs::remove_dir_all(&copy);
    if served != replayed {
        let keys_s: Vec<_> = served.keys().collect();
        let keys_r: Vec<_> = replayed.keys().collect();
        let differ: Vec<_> = served
            .iter()
            .filter(|(k, v)| replayed.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k:?}: served {v:?} rebuilt {:?}", replayed.get(k)))
            .take(3)
            .collect();
        return Err(format!(
            "projections differ from a rebuild: served {keys_s:?} rebuilt {keys_r:?}; {differ:?}"
        ));
    }
    Ok(served.len())
}

#[test]
fn acknowledged_writes_survive_sigkill_under_load_and_projections_equal_a_rebuild() {
    survive_sigkill_under_load(SERVER_ARGS, 50);
}

/// The same on the file backend (fewer kills by default: the log's own SIGKILL test kills it
/// 20 more times).
#[test]
fn acknowledged_writes_to_the_file_log_survive_sigkill_under_load() {
    survive_sigkill_under_load(&["--hypervisor", "none", "--backend", "file"], 20);
}

fn survive_sigkill_under_load(args: &[&str], default_cycles: usize) {
    let cycles: usize = std::env::var("VMPLANE_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cycles);
    let seed: u64 = std::env::var("VMPLANE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        });
    println!("crash_restart: {cycles} cycles, VMPLANE_CRASH_SEED={seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut rng = Rng::new(seed);
    let mut acks: Vec<Ack> = Vec::new();
    let mut watched = 0usize;
    let mut rebuilds = 0usize;
    let mut failures: Vec<String> = Vec::new();
    let started = Instant::now();
    let mut survived = 0usize;
    let mut clean_stops = 0usize;
    let mut checkpoint_starts = 0usize;

    for cycle in 0..=cycles {
        let from_checkpoint = data.join("projections").exists();
        let server = Server::start(&data, args);
        if cycle > 0 {
            checkpoint_starts += usize::from(from_checkpoint);
            let fresh_from = acks.partition_point(|a| a.cycle + 1 < cycle);
            if let Err(e) = check_restart(&server, &acks, fresh_from, &mut rng) {
                failures.push(format!("after kill {cycle}: {e}"));
                break;
            }
            if cycle % REBUILD_EVERY == 0 || cycle == cycles {
                match check_rebuild(&server, &data, dir.path(), args) {
                    Ok(_) => rebuilds += 1,
                    Err(e) => {
                        failures.push(format!("after kill {cycle}: {e}"));
                        break;
                    }
                }
            }
            survived += 1;
        }
        if cycle == cycles {
            break;
        }
        // Load, then SIGKILL at a random moment.
        let killed = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (url, killed) = (server.url.clone(), killed.clone());
                let seed = rng.next_u64();
                std::thread::spawn(move || worker(url, id, cycle, seed, killed))
            })
            .collect();
        let watch = {
            let (url, killed) = (server.url.clone(), killed.clone());
            std::thread::spawn(move || watcher(url, killed))
        };
        std::thread::sleep(Duration::from_millis(rng.range(150, 600)));
        killed.store(true, Ordering::SeqCst);
        if cycle % CLEAN_STOP_EVERY == CLEAN_STOP_EVERY - 1 {
            // A clean stop under load now and then writes the projections' checkpoint: the
            // restarts after it load that checkpoint and replay only the tail.
            let status = server.terminate(Duration::from_secs(30));
            assert!(status.success(), "SIGTERM under load: {status}");
            clean_stops += 1;
        } else {
            drop(server); // SIGKILL, then wait.
        }
        let mut this_cycle: Vec<Ack> = Vec::new();
        for w in workers {
            match w.join() {
                Ok(a) => this_cycle.extend(a),
                Err(_) => failures.push(format!("cycle {cycle}: a worker panicked")),
            }
        }
        let seen = watch.join().unwrap_or_default();
        watched += seen.len();
        if seen.iter().copied().ne(1..=seen.len() as u64) {
            failures.push(format!("cycle {cycle}: the watch from 0 saw {seen:?}"));
        }
        this_cycle.sort_by_key(|a| a.position);
        acks.extend(this_cycle);
        if !failures.is_empty() {
            break;
        }
    }
    let writes = acks.len();
    println!(
        "crash_restart: {survived} of {cycles} restarts passed ({clean_stops} after SIGTERM, the \
         rest after SIGKILL; {checkpoint_starts} loaded a checkpoint), {writes} acknowledged \
         writes ({} applies) checked, {rebuilds} rebuilds equal, {watched} watched events, \
         {:.1}s, {} failed",
        acks.iter()
            .filter(|a| matches!(a.op, Op::Apply { .. }))
            .count(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "VMPLANE_CRASH_SEED={seed}: {failures:#?}"
    );
    assert_eq!(survived, cycles);
    assert!(
        writes > cycles,
        "the load acknowledged only {writes} writes"
    );
}

/// Hostile manifests (billion laughs, deep nesting, a huge scalar, too many documents' worth of
/// bytes) are refused quickly with InvalidArgument or ResourceExhausted, and the server stays
/// up and keeps serving.
#[test]
fn yaml_bombs_are_refused_quickly_and_the_server_stays_up() {
    refuse_bombs(5_000);
}

/// Regression: serde_yaml's cost grows with the square of flow-collection depth (100,000 levels,
/// 200 KB, held the server for over a minute); core now refuses deep `[`/`{` nesting in one
/// linear pass before parsing.
#[test]
fn deep_yaml_flow_nesting_is_refused_quickly() {
    refuse_bombs(100_000);
}

fn refuse_bombs(yaml_depth: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), SERVER_ARGS);
    let mut laughs = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..12u8 {
        let prev = (b'a' + i - 1) as char;
        let cur = (b'a' + i) as char;
        laughs.push_str(&format!(
            "{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
    }
    let laughs = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: laughs\n{laughs}"
    );
    let deep_yaml = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: deep\nspec: {}{}",
        "[".repeat(yaml_depth),
        "]".repeat(yaml_depth)
    );
    let deep_json = format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"deep"}},"spec":{}{}}}"#,
        "{\"a\":".repeat(50_000),
        "}".repeat(50_000)
    );
    let huge_scalar = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: huge\n  annotations:\n    x: \"{}\"\n",
        "x".repeat(900 * 1024)
    );
    let many_keys = {
        let mut m = String::from(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: keys\nspec:\n",
        );
        let mut i = 0;
        while m.len() < 1000 * 1024 {
            m.push_str(&format!(
                "  k{i}: [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]\n"
            ));
            i += 1;
        }
        m
    };
    let rt = rt();
    rt.block_on(async {
        let mut objects = ObjectsClient::new(channel(&server).await);
        for (what, manifest) in [
            ("billion laughs", &laughs),
            ("deep YAML nesting", &deep_yaml),
            ("deep JSON nesting", &deep_json),
            ("a huge scalar", &huge_scalar),
            ("a flood of nodes", &many_keys),
        ] {
            let started = Instant::now();
            let refused = objects
                .apply(pb::ApplyRequest {
                    manifest: manifest.clone(),
                    namespace: "bombs".into(),
                    ..Default::default()
                })
                .await
                .expect_err(what);
            let took = started.elapsed();
            assert!(
                matches!(
                    refused.code(),
                    Code::InvalidArgument | Code::ResourceExhausted
                ),
                "{what}: {refused:?}"
            );
            assert!(took < Duration::from_secs(2), "{what} took {took:?}");
            println!(
                "yaml bomb: {what} ({} bytes) refused with {:?} in {took:?}",
                manifest.len(),
                refused.code()
            );
            // Still up, and nothing was appended.
            assert_eq!(head(&server).await, 0, "{what}: nothing appended");
        }
        // And it still serves writes.
        objects
            .apply(pb::ApplyRequest {
                manifest: vm_manifest("after-bombs", 128),
                namespace: "bombs".into(),
                ..Default::default()
            })
            .await
            .expect("the server still serves after the bombs");
    });
}
