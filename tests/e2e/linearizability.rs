//! Linearizability: concurrent clients race on one object, and the history of what they asked
//! and what they were told, with the time of each invocation and response, must be explained
//! by some order of the operations that respects real time and a sequential model
//! (Wing & Gong's search, with Lowe's memoization of visited configurations).
//!
//! - updates with an expected generation on one VM: a successful update with expected
//!   generation g saw g and made g + 1, a refused one (Aborted) did not see g;
//! - applies racing on one name: exactly one creates, the others configure it, and generations
//!   strictly increase;
//! - creates racing on one firmware UUID (different names): exactly one wins;
//! - and the log they leave: a watch from 0 delivers 1..=head in order without a duplicate or a
//!   gap, and a watch resumed from any position continues exactly.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tonic::Code;
use vmplane_gateway::pb::{
    self, admin_client::AdminClient, objects_client::ObjectsClient, watch_client::WatchClient,
};
use vmplane_tests::Server;

use crate::crash_restart::{Rng, vm_manifest};
use crate::{channel, rt};

/// Rounds per scenario; each round's history has CLIENTS × OPS_PER_CLIENT operations.
const ROUNDS: usize = 8;
const CLIENTS: usize = 5;
const OPS_PER_CLIENT: usize = 4;

/// One completed operation: what was asked, what came back, and when (nanoseconds since a
/// common origin).
#[derive(Debug, Clone)]
struct Call<I, O> {
    client: usize,
    invoke: u64,
    response: u64,
    input: I,
    output: O,
}

/// Whether `history` is linearizable with respect to the sequential model `step`, from
/// `initial`: `step(state, input, output)` is the state after the operation, or `None` when the
/// model could not have answered `output`.
fn linearizable<S, I, O>(
    history: &[Call<I, O>],
    initial: S,
    step: &dyn Fn(&S, &I, &O) -> Vec<S>,
) -> bool
where
    S: Clone + Eq + Hash,
{
    assert!(
        history.len() <= 64,
        "the search keeps its set of done calls in a u64"
    );
    let all: u64 = if history.len() == 64 {
        u64::MAX
    } else {
        (1u64 << history.len()) - 1
    };
    let mut seen: HashSet<(u64, S)> = HashSet::new();
    search(history, all, 0, &initial, step, &mut seen)
}

fn search<S, I, O>(
    history: &[Call<I, O>],
    all: u64,
    done: u64,
    state: &S,
    step: &dyn Fn(&S, &I, &O) -> Vec<S>,
    seen: &mut HashSet<(u64, S)>,
) -> bool
where
    S: Clone + Eq + Hash,
{
    if done == all {
        return true;
    }
    let pending = || (0..history.len()).filter(move |i| done & (1 << i) == 0);
    // A call may come next only if no pending call had returned before it was invoked.
    let first_response = pending()
        .map(|i| history[i].response)
        .min()
        .expect("something is pending");
    for i in pending() {
        let call = &history[i];
        if call.invoke > first_response {
            continue;
        }
        let done = done | (1 << i);
        for next in step(state, &call.input, &call.output) {
            if seen.insert((done, next.clone())) && search(history, all, done, &next, step, seen) {
                return true;
            }
        }
    }
    false
}

// ---------------------------------------------------------------------------------------------
// The sequential models.

/// An update of one VM with an expected generation (and a memory no other call writes).
#[derive(Debug, Clone)]
struct Update {
    expected: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum UpdateOutcome {
    Configured { generation: u64 },
    Conflict,
}

fn update_model(generation: &u64, input: &Update, output: &UpdateOutcome) -> Option<u64> {
    match output {
        UpdateOutcome::Configured { generation: g }
            if input.expected == *generation && *g == generation + 1 =>
        {
            Some(*g)
        }
        UpdateOutcome::Conflict if input.expected != *generation => Some(*generation),
        _ => None,
    }
}

fn update_step(generation: &u64, input: &Update, output: &UpdateOutcome) -> Vec<u64> {
    update_model(generation, input, output)
        .into_iter()
        .collect()
}

/// An apply without an expected generation: create or update.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ApplyOutcome {
    Created {
        generation: u64,
    },
    Configured {
        generation: u64,
    },
    /// NotFound for a write it may or may not have made (see the report): either.
    Unknown,
    /// Aborted: the server gave up after losing every retry of its decision to concurrent
    /// writes (see the report); it appended nothing.
    GaveUp,
}

/// State: the VM's generation, 0 when absent.
fn apply_model(generation: &u64, _input: &(), output: &ApplyOutcome) -> Vec<u64> {
    let next = match output {
        ApplyOutcome::Created { generation: 1 } if *generation == 0 => Some(1),
        ApplyOutcome::Configured { generation: g } if *generation > 0 && *g == generation + 1 => {
            Some(*g)
        }
        ApplyOutcome::GaveUp => Some(*generation),
        ApplyOutcome::Unknown => return vec![*generation, generation + 1],
        _ => None,
    };
    next.into_iter().collect()
}

/// A create of VM `name` with the firmware UUID every call of the round uses.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClaimOutcome {
    Created,
    Taken,
}

/// State: the name holding the firmware UUID.
fn claim_model(
    owner: &Option<String>,
    name: &String,
    output: &ClaimOutcome,
) -> Option<Option<String>> {
    match (owner, output) {
        (None, ClaimOutcome::Created) => Some(Some(name.clone())),
        (Some(o), ClaimOutcome::Taken) if o != name => Some(owner.clone()),
        _ => None,
    }
}

fn claim_step(owner: &Option<String>, name: &String, output: &ClaimOutcome) -> Vec<Option<String>> {
    claim_model(owner, name, output).into_iter().collect()
}

// ---------------------------------------------------------------------------------------------
// Recording.

fn nanos(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// Runs `CLIENTS` clients, each calling `call(client, op)` `OPS_PER_CLIENT` times after a common
/// barrier, and returns the history in invocation order.
fn record<I, O, F>(server: &Server, inputs: F) -> Vec<Call<I, O>>
where
    I: Clone + Send + 'static,
    O: Send + 'static,
    F: Fn(
        usize,
        usize,
    ) -> (
        I,
        Box<dyn Fn(tonic::transport::Channel) -> BoxFuture<O> + Send>,
    ),
{
    let origin = Instant::now();
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let calls: Vec<_> = (0..OPS_PER_CLIENT).map(|op| inputs(client, op)).collect();
            let url = server.url.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                rt().block_on(async move {
                    let channel = tonic::transport::Channel::from_shared(url)
                        .expect("url")
                        .connect()
                        .await
                        .expect("connect");
                    barrier.wait();
                    let mut history = Vec::new();
                    for (input, call) in calls {
                        let invoke = nanos(origin);
                        let output = call(channel.clone()).await;
                        let response = nanos(origin);
                        history.push(Call {
                            client,
                            invoke,
                            response,
                            input,
                            output,
                        });
                    }
                    history
                })
            })
        })
        .collect();
    let mut history: Vec<Call<I, O>> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    history.sort_by_key(|c| c.invoke);
    history
}

/// Applies whose response carried an object from a later write than their own (see the
/// report): the object in an ApplyResponse is read from the projections at or after the write's
/// position, so a concurrent write can show through.
static LATER_OBJECT_IN_RESPONSE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The generation the apply answered by `r` wrote: the object at the write's position (time
/// travel), which the response's object is not always (counted in
/// [`LATER_OBJECT_IN_RESPONSE`]).
async fn written_generation(channel: tonic::transport::Channel, r: &pb::ApplyResponse) -> u64 {
    let reported = r.object.as_ref().expect("object");
    let at = ObjectsClient::new(channel)
        .get(pb::GetRequest {
            r#ref: Some(pb::ObjectRef {
                kind: "vm".into(),
                namespace: reported.namespace.clone(),
                name: reported.name.clone(),
            }),
            at: Some(pb::PointInTime {
                at: Some(pb::point_in_time::At::Position(r.position)),
            }),
            min_position: 0,
        })
        .await
        .expect("get at the write's position")
        .into_inner()
        .object
        .expect("object");
    assert_eq!(at.resource_version, r.position, "the write's own event");
    if (reported.generation, reported.resource_version) != (at.generation, at.resource_version) {
        LATER_OBJECT_IN_RESPONSE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(
            reported.resource_version > r.position,
            "{reported:?} vs {at:?}"
        );
    }
    at.generation
}

/// Racing applies answered NotFound ("vm/NS/NAME revision N not found", see the report).
static UNKNOWN_OUTCOME: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

type BoxFuture<O> = std::pin::Pin<Box<dyn std::future::Future<Output = O> + Send>>;

fn server(backend: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        &dir.path().join("data"),
        &["--hypervisor", "none", "--backend", backend],
    );
    (dir, server)
}

fn apply_request(manifest: String, ns: &str, expected: Option<u64>) -> pb::ApplyRequest {
    pb::ApplyRequest {
        manifest,
        namespace: ns.to_string(),
        expected_generation: expected,
        ..Default::default()
    }
}

#[track_caller]
fn assert_linearizable<S, I, O>(
    what: &str,
    history: &[Call<I, O>],
    initial: S,
    step: &dyn Fn(&S, &I, &O) -> Vec<S>,
) where
    S: Clone + Eq + Hash,
    I: std::fmt::Debug,
    O: std::fmt::Debug,
{
    assert!(
        linearizable(history, initial, step),
        "{what}: the history is not linearizable:\n{history:#?}"
    );
}

#[test]
fn conflicting_updates_racing_creates_and_firmware_uuid_claims_are_linearizable() {
    linearizable_on("sled");
}

#[test]
fn on_the_file_log_conflicting_updates_and_claims_are_linearizable() {
    linearizable_on("file");
}

fn linearizable_on(backend: &str) {
    let (_dir, server) = server(backend);
    let mut rng = Rng::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64,
    );
    let mut checked = 0usize;
    let mut ops = 0usize;
    let mut gave_up = 0usize;
    for round in 0..ROUNDS {
        // 1. Updates with expected generations on one VM. Each client guesses a generation
        //    near the current one, so that some win and some conflict.
        let ns = format!("lin-update-{round}");
        rt().block_on(async {
            ObjectsClient::new(channel(&server).await)
                .apply(apply_request(vm_manifest("target", 64), &ns, None))
                .await
                .expect("create the target")
        });
        let guesses: Vec<u64> = (0..CLIENTS * OPS_PER_CLIENT)
            .map(|_| 1 + rng.range(0, (OPS_PER_CLIENT * 2) as u64))
            .collect();
        let history = record(&server, |client, op| {
            let expected = guesses[client * OPS_PER_CLIENT + op];
            let memory = 128 + (client * OPS_PER_CLIENT + op) as u64;
            let ns = ns.clone();
            let call: Box<dyn Fn(tonic::transport::Channel) -> BoxFuture<UpdateOutcome> + Send> =
                Box::new(move |channel: tonic::transport::Channel| {
                    let request = apply_request(vm_manifest("target", memory), &ns, Some(expected));
                    Box::pin(async move {
                        match ObjectsClient::new(channel.clone()).apply(request).await {
                            Ok(r) => {
                                let r = r.into_inner();
                                assert_eq!(r.outcome, "configured");
                                UpdateOutcome::Configured {
                                    generation: written_generation(channel, &r).await,
                                }
                            }
                            Err(s) if s.code() == Code::Aborted => UpdateOutcome::Conflict,
                            Err(s) => panic!("update with expected {expected}: {s}"),
                        }
                    })
                });
            (Update { expected }, call)
        });
        assert_linearizable(
            "updates with expected generations",
            &history,
            1,
            &update_step,
        );
        let wins: Vec<u64> = history
            .iter()
            .filter_map(|c| match c.output {
                UpdateOutcome::Configured { generation } => Some(generation),
                UpdateOutcome::Conflict => None,
            })
            .collect();
        let mut sorted = wins.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            wins.len(),
            "two updates made the same generation: {wins:?}"
        );
        checked += 1;
        ops += history.len();

        // 2. Applies racing on one name: exactly one creates.
        let ns = format!("lin-create-{round}");
        let history = record(&server, |client, op| {
            let memory = 128 + (client * OPS_PER_CLIENT + op) as u64;
            let ns = ns.clone();
            let call: Box<dyn Fn(tonic::transport::Channel) -> BoxFuture<ApplyOutcome> + Send> =
                Box::new(move |channel: tonic::transport::Channel| {
                    let request = apply_request(vm_manifest("contested", memory), &ns, None);
                    Box::pin(async move {
                        let r = match ObjectsClient::new(channel.clone()).apply(request).await {
                            Ok(r) => r.into_inner(),
                            Err(s) if s.code() == Code::Aborted => return ApplyOutcome::GaveUp,
                            Err(s) if s.code() == Code::NotFound => {
                                UNKNOWN_OUTCOME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                return ApplyOutcome::Unknown;
                            }
                            Err(s) => panic!("apply: {s}"),
                        };
                        let generation = written_generation(channel, &r).await;
                        match r.outcome.as_str() {
                            "created" => ApplyOutcome::Created { generation },
                            "configured" => ApplyOutcome::Configured { generation },
                            other => panic!("outcome {other}"),
                        }
                    })
                });
            ((), call)
        });
        let created = history
            .iter()
            .filter(|c| matches!(c.output, ApplyOutcome::Created { .. }))
            .count();
        assert_eq!(created, 1, "exactly one racing create wins: {history:#?}");
        assert_linearizable("applies racing on one name", &history, 0, &apply_model);
        gave_up += history
            .iter()
            .filter(|c| c.output == ApplyOutcome::GaveUp)
            .count();
        checked += 1;
        ops += history.len();

        // 3. Creates racing on one firmware UUID, each under its own name.
        let ns = format!("lin-uuid-{round}");
        let uuid = format!("5f0c2a7e-0000-4000-8000-{:012x}", rng.next_u64() >> 16);
        let history = record(&server, |client, op| {
            let name = format!("claim-{client}-{op}");
            let manifest = vm_manifest(&name, 128).replace(
                r#""devices":{}"#,
                &format!(r#""devices":{{}},"firmware":{{"uuid":"{uuid}"}}"#),
            );
            assert!(manifest.contains(&uuid));
            let ns = ns.clone();
            let call: Box<dyn Fn(tonic::transport::Channel) -> BoxFuture<ClaimOutcome> + Send> =
                Box::new(move |channel: tonic::transport::Channel| {
                    let request = apply_request(manifest.clone(), &ns, None);
                    Box::pin(async move {
                        match ObjectsClient::new(channel).apply(request).await {
                            Ok(r) => {
                                assert_eq!(r.into_inner().outcome, "created");
                                ClaimOutcome::Created
                            }
                            Err(s) if s.code() == Code::AlreadyExists => ClaimOutcome::Taken,
                            Err(s) => panic!("create with a contested firmware UUID: {s}"),
                        }
                    })
                });
            (name, call)
        });
        let created = history
            .iter()
            .filter(|c| c.output == ClaimOutcome::Created)
            .count();
        assert_eq!(
            created, 1,
            "exactly one VM gets the firmware UUID: {history:#?}"
        );
        assert_linearizable(
            "creates racing on one firmware UUID",
            &history,
            None,
            &claim_step,
        );
        checked += 1;
        ops += history.len();
    }

    // The log they left: a watch from 0 and from any position.
    let resumed = rt().block_on(async {
        let head = AdminClient::new(channel(&server).await)
            .log_info(pb::LogInfoRequest {})
            .await
            .expect("log info")
            .into_inner()
            .head_position;
        let all = watch_until(&server, 0, head).await;
        assert_eq!(
            all.iter().map(|e| e.position).collect::<Vec<_>>(),
            (1..=head).collect::<Vec<_>>(),
            "a watch from 0: in order, no duplicate, no gap"
        );
        let mut resumed = 0;
        for _ in 0..10 {
            let from = rng.range(0, head + 1);
            let got = watch_until(&server, from, head).await;
            assert_eq!(got.as_slice(), &all[from as usize..], "resumed from {from}");
            resumed += 1;
        }
        resumed
    });
    // Both were server bugs (a reply describing a later write; a stream revision announced
    // before it was readable), fixed: they must not come back.
    assert_eq!(
        LATER_OBJECT_IN_RESPONSE.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "an apply's reply carried the object as a later write left it"
    );
    assert_eq!(
        UNKNOWN_OUTCOME.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "a racing apply was answered NotFound"
    );
    println!(
        "linearizability: {checked} histories checked ({ops} operations), all linearizable; \
         {resumed} resumed watches exact, 0 failed; {gave_up} unconditional applies refused \
         with Aborted after losing every retry; {} apply responses carried the object of a later \
         write; {} racing applies answered NotFound",
        LATER_OBJECT_IN_RESPONSE.load(std::sync::atomic::Ordering::Relaxed),
        UNKNOWN_OUTCOME.load(std::sync::atomic::Ordering::Relaxed)
    );
}

async fn watch_until(server: &Server, after: u64, until: u64) -> Vec<pb::WatchEvent> {
    let mut events = Vec::new();
    if after >= until {
        return events;
    }
    let mut stream = WatchClient::new(channel(server).await)
        .watch(pb::WatchRequest {
            all_namespaces: true,
            from_position: Some(after),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the watch stalled")
            .expect("watch stream")
            .expect("the watch ended early");
        let at = ev.position;
        events.push(ev);
        if at >= until {
            return events;
        }
    }
}

/// The checker itself: it accepts a sequential history and rejects impossible ones.
#[test]
fn the_checker_rejects_histories_no_order_explains() {
    let call = |client, invoke, response, expected, output| Call {
        client,
        invoke,
        response,
        input: Update { expected },
        output,
    };
    use UpdateOutcome::{Configured, Conflict};
    // Two overlapping updates expecting 1: one wins, either order.
    let ok = [
        call(0, 0, 10, 1, Conflict),
        call(1, 1, 9, 1, Configured { generation: 2 }),
    ];
    assert!(linearizable(&ok, 1, &update_step));
    // Both won with the same expected generation.
    let both = [
        call(0, 0, 10, 1, Configured { generation: 2 }),
        call(1, 1, 9, 1, Configured { generation: 2 }),
    ];
    assert!(!linearizable(&both, 1, &update_step));
    // A conflict reported for an update that ran strictly before the only other write.
    let stale = [
        call(0, 0, 1, 1, Conflict),
        call(1, 2, 3, 1, Configured { generation: 2 }),
    ];
    assert!(!linearizable(&stale, 1, &update_step));
    // The same calls overlapping: the conflict can follow the write.
    let overlapping = [
        call(0, 0, 3, 1, Conflict),
        call(1, 1, 2, 1, Configured { generation: 2 }),
    ];
    assert!(linearizable(&overlapping, 1, &update_step));
    // Two creates of one firmware UUID.
    let two = [
        Call {
            client: 0,
            invoke: 0,
            response: 5,
            input: "a".to_string(),
            output: ClaimOutcome::Created,
        },
        Call {
            client: 1,
            invoke: 1,
            response: 6,
            input: "b".to_string(),
            output: ClaimOutcome::Created,
        },
    ];
    assert!(!linearizable(&two, None, &claim_step));
    assert_eq!(two[1].client, 1);
}
