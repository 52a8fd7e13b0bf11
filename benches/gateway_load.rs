//! Load generator for the gRPC gateway: VM creates, then updates, with 1, 16 and 64 concurrent
//! clients against a real server (in this process, on a loopback port, with its own data dir),
//! beside the log's own append throughput at the same concurrency, measured in the same run.
//!
//! ```sh
//! cargo run --release -p vmplane-benches --bin gateway-load            # 1, 16, 64 clients
//! cargo run --release -p vmplane-benches --bin gateway-load -- 64 5    # 64 clients, 5 s each
//! cargo run --release -p vmplane-benches --bin gateway-load -- 64 5 file   # the file backend
//! cargo run --release -p vmplane-benches --bin gateway-load -- 64 5 file 2 # clients on 2 threads
//! cargo run --release -p vmplane-benches --bin gateway-load -- 64 5 file 1 2 # server: 2 workers
//! cargo run --release -p vmplane-benches --bin gateway-load -- --rate 20000 64 6 file
//! ```
//!
//! The server is set up as `vmplane serve` sets it up: the same allocator, the same logging
//! (its per-request spans with the principal and the object are created and recorded), and the
//! same runtime, with as many workers as `vmplane serve`'s default (the fifth argument sets
//! how many).
//!
//! The load clients run on a runtime of their own with one thread by default (the fourth
//! argument sets how many), as the etcd figure the gateway's target is set against was measured
//! (one client thread): on 2 cores, every thread the clients take is taken from the server.
//!
//! Prints, per concurrency, a row for each kind of request: creates, creates answered in the
//! basic view (the object's identity and versions without its text), updates, the updates'
//! manifests applied again (answered `unchanged`, nothing appended), dry-run creates
//! (parse, decide and render without the log's commit), reads (`Get` of a VM the create phase
//! made, its JSON text from the projections) and the gRPC floor (the standard
//! health service's `Check` from the same clients against the same server: its transport and
//! layers, no domain work); then the log's own durable single-event appends/s. Each row: the
//! rate, p50 and p99 latency, the processor time the whole process spent per request with, in
//! brackets, the part the load clients' own threads spent (the rest is the server's) — figures
//! that hold still when other work shares the machine — and creates/s as a ratio of its rate.
//! With `--rate N[,N...]`, last phases send creates on a schedule (answered with the whole
//! object, or in the basic view with `--paced-view basic`), N/s in all for each N,
//! whatever the answers do (an open loop, as a service's users send), each latency counted from
//! when the request was due: the rate a latency target is stated at. The closed loop shows the
//! rate at saturation, with a latency that is the clients' count over that rate, and it hides
//! stalls: during one, its clients send nothing, so a stall delays one request per client
//! where, at a rate, it delays every request due while it lasts (coordinated omission).
//! With `GATEWAY_LOAD_TAIL` set, each phase also prints its latency tail (p90 to max) and when
//! its slowest 1% were sent, per 20 ms of the run, each window with the requests answered before
//! it (stalls show as a few crowded windows; a stall at the same count in every run grows with
//! the data); a paced phase also prints how late its requests left (a client still waiting for
//! its previous answer, or the load clients' own thread late).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use vmplane_gateway::cli::{Backend, ServeArgs};
use vmplane_gateway::pb;
use vmplane_store::{AppendRequest, EventLog, ExpectedRevision, FileLog, ProposedEvent, SledLog};

/// The `vmplane` binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
Load generator for the gRPC gateway: VM creates (answered with the whole object, then in the
basic view), updates, the same manifests again (unchanged), dry-run creates, reads (`Get`)
and health checks
against a real server in this process, beside the log's own append throughput. The clients
share 4 HTTP/2 connections, which write as the server's do (no vectored writes: the frames
ready together leave in one write).

Usage: gateway-load [--rate N[,N...] [--paced-view full|basic]] [--linger-us N] [--tls] [CLIENTS [SECONDS [BACKEND [CLIENT_THREADS [SERVER_WORKERS]]]]]

  CLIENTS         concurrent clients (default: 1, 16 and 64 in turn)
  SECONDS         length of each phase (default 5)
  BACKEND         sled or file (default sled)
  CLIENT_THREADS  threads of the load clients' runtime (default 1)
  SERVER_WORKERS  the server runtime's workers (default: as `vmplane serve`)
  --rate N,...    also a phase of creates paced at N/s in all for each N, spread over the
                  clients: its latency counts from when each request was due, so a request
                  held back by a slow answer before it counts the wait (no coordinated
                  omission)
  --paced-view V  the view the paced creates ask their answer in: full (the whole object,
                  the default) or basic (without its text, as `vmplane apply` asks)
  --tls           serve over TLS (`vmplane serve --tls-cert/--tls-key`, a certificate made
                  for the run) and connect the clients over it
  --linger-us N   the file log's committer lingers N µs for company, in the server and in
                  the log's own run (`vmplane serve --group-commit-linger-us`; default:
                  the server's, 150 µs with `file`)

Environment: GATEWAY_LOAD_TAIL=1 also prints each phase's latency tail and when its slowest
1% were sent (and, for a paced phase, how late its requests left).

Example: cargo run --release -p vmplane-benches --bin gateway-load -- 64 6 file";

/// Channels the clients share (HTTP/2 multiplexes the rest).
const CHANNELS: usize = 4;

/// `--tls`: a CA made for the run, and a certificate it signed for `127.0.0.1`, the server's
/// certificate and key written in `dir` for `vmplane serve --tls-cert/--tls-key`.
struct Pki {
    ca_pem: String,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl Pki {
    fn new(dir: &std::path::Path) -> anyhow::Result<Pki> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "gateway-load CA");
        let ca_key = KeyPair::generate()?;
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate()?;
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned()])?
            .signed_by(&server_key, &issuer)?;
        let (cert, key) = (dir.join("server.pem"), dir.join("server-key.pem"));
        std::fs::write(&cert, server.pem())?;
        std::fs::write(&key, server_key.serialize_pem())?;
        Ok(Pki {
            ca_pem: ca.pem(),
            cert,
            key,
        })
    }
}

/// The clients' connector: a TCP connection with `TCP_NODELAY`, wrapped as the server wraps
/// its own ([`vmplane_gateway::server::PlainWrites`]), so that the requests ready together on
/// one connection (each ~300 bytes, past h2's 256-byte threshold for queueing a frame on its
/// own) leave in one write, as the server's answers do, not in one `writev` each.
fn plain_writes(
    addr: std::net::SocketAddr,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<vmplane_gateway::server::PlainWrites<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Future + Send,
> + Send
+ Clone
+ 'static {
    tower::service_fn(move |_: tonic::transport::Uri| async move {
        let conn = tokio::net::TcpStream::connect(addr).await?;
        conn.set_nodelay(true)?;
        Ok(hyper_util::rt::TokioIo::new(
            vmplane_gateway::server::PlainWrites(conn),
        ))
    })
}

fn manifest(name: &str, memory_mi: u32) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}","namespace":"load"}},"spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{"cpu":{{"cores":1}},"memory":{{"guest":"{memory_mi}Mi"}},"devices":{{}}}}}}}}}}}}"#
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Phase {
    ops: usize,
    seconds: f64,
    p50: Duration,
    p99: Duration,
    /// Processor time of this whole process (server and clients) per request.
    cpu_per_op: Duration,
    /// The part of it the load clients' own threads spent.
    client_cpu_per_op: Duration,
}

/// Name of the load clients' runtime threads (the server's keep tokio's default name).
const CLIENT_THREADS: &str = "load-client";

/// Processor time so far of this process's threads named [`CLIENT_THREADS`] (from
/// `/proc/self/task/*/stat`; zero where that is not readable).
fn client_threads_cpu() -> Duration {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut total = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ..." : comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with(CLIENT_THREADS) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, here 11 and 12 (the state is 0).
        let time = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total += time(11) + time(12);
    }
    Duration::from_micros(total * 1_000_000 / ticks)
}

/// User + system processor time of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

impl Phase {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.seconds
    }

    /// "total (of which clients)" processor µs per request.
    fn cpu(&self) -> String {
        format!(
            "{} ({})",
            self.cpu_per_op.as_micros(),
            self.client_cpu_per_op.as_micros()
        )
    }
}

/// How many of its own VMs each client reads in turn in the `Get` phase. Its create phase made
/// more: at 64 clients, on sled, ~200 per client in each second of the phase.
const GETS_PER_CLIENT: usize = 64;

/// What a phase's clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// `Apply` of a new VM.
    Create,
    /// `Apply` of a new VM asking for the basic view (`OBJECT_VIEW_BASIC`): the same durable
    /// create, answered with the object's kind, name, uid, generation and resourceVersion but
    /// not its text — what `vmplane apply` asks for unless it prints the object (`-o
    /// json|yaml`), and what etcd's put answers (no value).
    CreateBasic,
    /// `Apply` of an edit to a VM the create phase made, in the same order.
    Update,
    /// `Apply` of the manifest the update phase applied, again, to one of the first 64 VMs this
    /// client's update phase edited (round robin): answered `unchanged`, nothing appended —
    /// what GitOps automation sends most (the repository's manifests applied on a schedule).
    Reapply,
    /// `Apply --dry-run` of a new VM: parse, validate, decide (the uniqueness claims checked)
    /// and render, nothing appended — a create without the log's commit.
    DryRun,
    /// `Get` of one of the first 64 VMs this client's create phase made (round robin): the
    /// current object's JSON text from the projections, as `vmplane get vm NAME -o json`.
    Get,
    /// The standard health service's `Check`: the same server, transport, layers (metrics,
    /// tracing) and clients, no domain work — the gRPC floor the other phases stand on.
    HealthCheck,
}

/// The pacer of an open-loop phase: a thread of its own that hands each paced client the
/// times its requests are due, `rate` requests/s in all, round robin over the clients (each
/// client's requests `clients / rate` apart, the clients offset from each other).
///
/// A request's latency is counted from when it was due, not from when it left: a request its
/// client could not send on time, because the one before it was still unanswered, counts the
/// wait (no coordinated omission: a slow answer is not hidden by the client sending less).
/// The pacer sleeps with the kernel's timer (tens of µs late), not tokio's (a whole
/// millisecond), and wakes at most every [`Pacer::TICK`], handing out all that is due: what
/// it is late counts in the latency too, so the figures are an upper bound.
struct Pacer {
    thread: std::thread::JoinHandle<()>,
}

impl Pacer {
    /// The pacer's shortest sleep: it hands out ~`rate × TICK` requests per wake.
    const TICK: Duration = Duration::from_micros(100);

    /// Starts pacing at `started` until `stop`; one receiver of due times per client.
    fn start(
        started: Instant,
        rate: f64,
        clients: usize,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<(Pacer, Vec<tokio::sync::mpsc::UnboundedReceiver<Instant>>)> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..clients)
            .map(|_| tokio::sync::mpsc::unbounded_channel::<Instant>())
            .unzip();
        let every = Duration::from_secs_f64(1.0 / rate);
        // Named as the clients' threads: its processor time is the clients'.
        let thread = std::thread::Builder::new().name(format!("{CLIENT_THREADS}-pacer"));
        let thread = thread.spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                loop {
                    let due = started + every.mul_f64(k as f64);
                    if due > now {
                        // Sleep until the next is due, TICK at least.
                        std::thread::sleep((due - now).max(Self::TICK));
                        break;
                    }
                    let client = usize::try_from(k % clients as u64).unwrap_or(0);
                    if senders[client].send(due).is_err() {
                        return;
                    }
                    k += 1;
                }
            }
        })?;
        Ok((Pacer { thread }, receivers))
    }
}

/// `clients` tasks, each sending `load` requests for `run` seconds: each as soon as the one
/// before it is answered (a closed loop, the server saturated), or, with `rate`, on a
/// schedule of `rate` requests/s in all (see [`Pacer`]).
async fn drive(
    channels: &[Channel],
    clients: usize,
    run: Duration,
    load: Load,
    round: usize,
    rate: Option<f64>,
) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let cpu_before = process_cpu();
    let client_cpu_before = client_threads_cpu();
    let (pacer, mut receivers) = match rate {
        Some(rate) => {
            let (pacer, receivers) = Pacer::start(started, rate, clients, stop.clone())?;
            (Some(pacer), Some(receivers))
        }
        None => (None, None),
    };
    let mut tasks = Vec::new();
    for c in 0..clients {
        let channel = channels[c % channels.len()].clone();
        let mut client = pb::objects_client::ObjectsClient::new(channel.clone());
        let mut health = HealthClient::new(channel);
        let stop = stop.clone();
        let mut due_times = receivers.as_mut().and_then(|r| r.pop());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let name = match (load, due_times.is_some()) {
                    // New names: a dry run of a name the create phase made would be an update,
                    // and so would a paced create.
                    (_, true) => format!("paced{}-{load:?}-r{round}-c{c}-{i}", rate.unwrap_or(0.0))
                        .to_ascii_lowercase(),
                    (Load::DryRun, _) => format!("dry-r{round}-c{c}-{i}"),
                    (Load::CreateBasic, _) => format!("basic-r{round}-c{c}-{i}"),
                    (Load::Reapply, _) => format!("vm-r{round}-c{c}-{}", i % GETS_PER_CLIENT),
                    _ => format!("vm-r{round}-c{c}-{i}"),
                };
                let memory_mi = if matches!(load, Load::Update | Load::Reapply) {
                    256
                } else {
                    128
                };
                let t = match &mut due_times {
                    Some(due_times) => match due_times.recv().await {
                        Some(due) => due,
                        None => break,
                    },
                    None => Instant::now(),
                };
                let sent = Instant::now();
                let r = match load {
                    Load::HealthCheck => {
                        health.check(HealthCheckRequest::default()).await.map(drop)
                    }
                    Load::Get => client
                        .get(pb::GetRequest {
                            r#ref: Some(pb::ObjectRef {
                                kind: "vm".into(),
                                namespace: "load".into(),
                                name: format!("vm-r{round}-c{c}-{}", i % GETS_PER_CLIENT),
                            }),
                            ..Default::default()
                        })
                        .await
                        .map(drop),
                    Load::Create
                    | Load::CreateBasic
                    | Load::Update
                    | Load::Reapply
                    | Load::DryRun => {
                        let request = pb::ApplyRequest {
                            manifest: manifest(&name, memory_mi),
                            namespace: "load".into(),
                            dry_run: load == Load::DryRun,
                            view: if load == Load::CreateBasic {
                                pb::ObjectView::Basic
                            } else {
                                pb::ObjectView::Full
                            }
                            .into(),
                            ..Default::default()
                        };
                        match client.apply(request).await {
                            // The phase measures what it says or nothing.
                            Ok(answer)
                                if load == Load::Reapply
                                    && answer.get_ref().outcome != "unchanged" =>
                            {
                                eprintln!(
                                    "re-apply of {name} answered {}, not unchanged",
                                    answer.get_ref().outcome
                                );
                                break;
                            }
                            answer => answer.map(drop),
                        }
                    }
                };
                if let Err(status) = r {
                    eprintln!("request failed: {status}");
                    break;
                }
                lat.push((
                    t.duration_since(started),
                    t.elapsed(),
                    sent.duration_since(t),
                ));
                i += 1;
            }
            lat
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    if let Some(pacer) = pacer {
        let _ = pacer.thread.join();
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = process_cpu().saturating_sub(cpu_before);
    let client_cpu = client_threads_cpu().saturating_sub(client_cpu_before);
    if std::env::var_os("GATEWAY_LOAD_TAIL").is_some() {
        let requests: Vec<(Duration, Duration)> = all.iter().map(|(s, l, _)| (*s, *l)).collect();
        print_tail(&requests);
        if rate.is_some() {
            let mut late: Vec<Duration> = all.iter().map(|(_, _, late)| *late).collect();
            late.sort();
            eprintln!(
                "sent after due: p50 {:.2?} p90 {:.2?} p99 {:.2?} max {:.2?}",
                percentile(&late, 0.5),
                percentile(&late, 0.9),
                percentile(&late, 0.99),
                percentile(&late, 1.0)
            );
        }
    }
    let mut all: Vec<Duration> = all.into_iter().map(|(_, latency, _)| latency).collect();
    all.sort();
    let ops = u32::try_from(all.len().max(1)).unwrap_or(u32::MAX);
    Ok(Phase {
        ops: all.len(),
        seconds,
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        cpu_per_op: cpu / ops,
        client_cpu_per_op: client_cpu / ops,
    })
}

/// With `GATEWAY_LOAD_TAIL` set: the latency tail of a phase, and when its slowest 1% were
/// sent (per 20 ms of the run), to tell a tail spread over the run from one made of stalls.
fn print_tail(requests: &[(Duration, Duration)]) {
    let mut sorted: Vec<Duration> = requests.iter().map(|(_, latency)| *latency).collect();
    sorted.sort();
    let at = |p| percentile(&sorted, p);
    eprintln!(
        "tail: p90 {:.2?} p95 {:.2?} p99 {:.2?} p99.9 {:.2?} max {:.2?}",
        at(0.90),
        at(0.95),
        at(0.99),
        at(0.999),
        at(1.0)
    );
    let p99 = at(0.99);
    let mut windows = std::collections::BTreeMap::<u128, usize>::new();
    for (sent, latency) in requests {
        if *latency >= p99 {
            *windows.entry(sent.as_millis() / 20).or_default() += 1;
        }
    }
    // Requests answered before each window began: a stall at the same count in every run
    // points at something that grows with the data (a table outgrowing its allocation).
    let mut answered: Vec<Duration> = requests.iter().map(|(s, l)| *s + *l).collect();
    answered.sort();
    let spread: Vec<String> = windows
        .iter()
        .map(|(w, n)| {
            let start = Duration::from_millis(u64::try_from(*w * 20).unwrap_or(u64::MAX));
            let before = answered.partition_point(|a| *a < start);
            format!("{:.2}s:{n}@{before}", *w as f64 / 50.0)
        })
        .collect();
    eprintln!("slowest 1% sent at: {}", spread.join(" "));
}

/// The log alone: `writers` threads appending one ~300-byte event each, durable, for `run`.
fn log_baseline(backend: Backend, writers: usize, run: Duration, linger_us: Option<u64>) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let log: Arc<dyn EventLog> = match backend {
        // The server's options: the same linger.
        Backend::File => Arc::new(
            FileLog::open_with(
                dir.path().join("log"),
                vmplane_gateway::server::file_options(linger_us),
            )
            .expect("open log"),
        ),
        _ => Arc::new(SledLog::open(dir.path().join("log")).expect("open log")),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let event = ProposedEvent {
                        id: uuid::Uuid::now_v7(),
                        event_type: "LoadEventAppended".into(),
                        schema_version: 1,
                        payload: vec![7u8; 300],
                        actor: "load".into(),
                        correlation_id: uuid::Uuid::now_v7(),
                        causation_id: None,
                    };
                    let stream = format!("load/{w}/{n}");
                    if log
                        .append(AppendRequest::new(
                            stream,
                            ExpectedRevision::NoStream,
                            vec![event],
                        ))
                        .is_err()
                    {
                        break;
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let total: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    total as f64 / started.elapsed().as_secs_f64()
}

/// Removes `name` and the value after it from `args` and returns the value (`None` when `name`
/// is not given); `name` without a value is an error saying what it needs.
fn take_option(args: &mut Vec<String>, name: &str, needs: &str) -> anyhow::Result<Option<String>> {
    let Some(at) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    anyhow::ensure!(at + 1 < args.len(), "{name}: needs {needs}");
    let value = args.remove(at + 1);
    args.remove(at);
    Ok(Some(value))
}

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let rates: Vec<u32> = match take_option(&mut args, "--rate", "a number of creates/s")? {
        Some(value) => value
            .split(',')
            .map(|rate| match rate.parse::<u32>() {
                Ok(0) => anyhow::bail!("--rate {value:?}: at least 1 create/s"),
                Ok(rate) => Ok(rate),
                Err(e) => anyhow::bail!(
                    "--rate {value:?}: {rate:?}: {e} (whole numbers of creates/s, \
                     separated by commas)"
                ),
            })
            .collect::<anyhow::Result<_>>()?,
        None => Vec::new(),
    };
    let paced_load = match take_option(&mut args, "--paced-view", "full or basic")?.as_deref() {
        None | Some("full") => Load::Create,
        Some("basic") => Load::CreateBasic,
        Some(other) => anyhow::bail!("--paced-view {other:?}: full or basic"),
    };
    let linger_us: Option<u64> = take_option(&mut args, "--linger-us", "a number of microseconds")?
        .map(|value| {
            value.parse::<u64>().map_err(|e| {
                anyhow::anyhow!("--linger-us {value:?}: {e} (a whole number of microseconds)")
            })
        })
        .transpose()?;
    let tls = match args.iter().position(|a| a == "--tls") {
        Some(at) => {
            args.remove(at);
            true
        }
        None => false,
    };
    // The `index`th argument, `what`, as a number (`None` when not given).
    let number = |index: usize, what: &str| -> anyhow::Result<Option<u64>> {
        args.get(index)
            .map(|s| {
                s.parse::<u64>().map_err(|e| {
                    anyhow::anyhow!("{what} {s:?}: {e} (a whole number; --help for usage)")
                })
            })
            .transpose()
    };
    let levels: Vec<usize> = match number(0, "CLIENTS")? {
        Some(n) => vec![usize::try_from(n)?],
        None => vec![1, 16, 64],
    };
    let run = Duration::from_secs(number(1, "SECONDS")?.unwrap_or(5));
    let backend = match args.get(2).map(String::as_str) {
        None | Some("sled") => Backend::Sled,
        Some("file") => Backend::File,
        Some(other) => anyhow::bail!("BACKEND {other:?}: expected sled or file"),
    };
    let client_threads = usize::try_from(number(3, "CLIENT_THREADS")?.unwrap_or(1))?;
    anyhow::ensure!(client_threads > 0, "CLIENT_THREADS: at least 1");
    let server_workers = match number(4, "SERVER_WORKERS")? {
        Some(n) => usize::try_from(n)?,
        None => vmplane_gateway::server::default_worker_threads(),
    };
    anyhow::ensure!(server_workers > 0, "SERVER_WORKERS: at least 1");
    let linger = match backend {
        Backend::File => format!(
            " (its committer lingers up to {} µs for company)",
            vmplane_gateway::server::file_options(linger_us)
                .group_commit_linger
                .as_micros()
        ),
        _ => String::new(),
    };
    println!(
        "backend: {}{linger}, load clients on {client_threads} thread(s), server on \
         {server_workers} worker(s){}",
        backend.name(),
        if tls { ", over TLS" } else { "" }
    );

    // The server logs as `vmplane serve` does: its per-request spans (principal, object) cost
    // what they cost in the binary.
    vmplane_gateway::server::init_tracing();
    let dir = tempfile::tempdir()?;
    let pki = if tls {
        Some(Pki::new(dir.path())?)
    } else {
        None
    };
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = probe.local_addr()?;
    drop(probe);
    let server_rt = vmplane_gateway::server::runtime(server_workers)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = ServeArgs {
        worker_threads: Some(server_workers),
        data: dir.path().join("data"),
        listen: addr,
        backend,
        auth: None,
        metrics_listen: None,
        tls_cert: pki.as_ref().map(|p| p.cert.clone()),
        tls_key: pki.as_ref().map(|p| p.key.clone()),
        etcd_endpoints: Vec::new(),
        etcd_prefix: "vmplane".into(),
        etcd_max_txn_ops: 128,
        leader_lease_seconds: 5,
        log_cache_mib: vmplane_store::SledOptions::DEFAULT_CACHE_MIB,
        group_commit_linger_us: linger_us,
        // The control plane alone: no reconciler competing for the cores.
        hypervisor: vec!["none".into()],
        connections: Default::default(),
    };
    let server = server_rt.spawn(vmplane_gateway::server::serve(serve, async move {
        let _ = stop_rx.await;
    }));

    let mut client_rt = tokio::runtime::Builder::new_multi_thread();
    client_rt
        .worker_threads(client_threads)
        .thread_name(CLIENT_THREADS)
        .enable_all();
    // Without the LIFO slot, a client's connection task, woken by each request sent, runs after
    // the other clients ready to send theirs, not before: their requests leave in one write
    // (0.3 `writev` per create instead of 1.16 at 64 clients), which leaves the cores to the
    // server. Built without `tokio_unstable`, tokio's default.
    #[cfg(tokio_unstable)]
    client_rt.disable_lifo_slot();
    let client_rt = client_rt.build()?;
    let ran = client_rt.block_on(async {
        let url = format!("{}://{addr}", if tls { "https" } else { "http" });
        let mut channels = Vec::new();
        for _ in 0..CHANNELS {
            let ch = loop {
                let mut endpoint = Endpoint::from_shared(url.clone())?;
                if let Some(pki) = &pki {
                    endpoint = endpoint
                        .tls_config(tonic::transport::ClientTlsConfig::new().ca_certificate(
                            tonic::transport::Certificate::from_pem(&pki.ca_pem),
                        ))?;
                }
                match endpoint.connect_with_connector(plain_writes(addr)).await {
                    Ok(ch) => break ch,
                    // It refused its settings (or failed to start): its error is told below.
                    Err(_) if server.is_finished() => return Ok(false),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            channels.push(ch);
        }
        println!(
            "{:>7} | {:<22} | {:>9} {:>9} {:>9} {:>15} | {:>12}",
            "clients", "requests", "per s", "p50", "p99", "cpu µs/op (cl)", "creates / it"
        );
        for (round, &clients) in levels.iter().enumerate() {
            let create = drive(&channels, clients, run, Load::Create, round, None).await?;
            let basic = drive(&channels, clients, run, Load::CreateBasic, round, None).await?;
            let update = drive(&channels, clients, run, Load::Update, round, None).await?;
            let reapply = drive(&channels, clients, run, Load::Reapply, round, None).await?;
            let dry_run = drive(&channels, clients, run, Load::DryRun, round, None).await?;
            let get = drive(&channels, clients, run, Load::Get, round, None).await?;
            let floor = drive(&channels, clients, run, Load::HealthCheck, round, None).await?;
            let mut paced = Vec::new();
            for &rate in &rates {
                let rate = Some(f64::from(rate));
                paced.push(drive(&channels, clients, run, paced_load, round, rate).await?);
            }
            let log =
                tokio::task::spawn_blocking(move || log_baseline(backend, clients, run, linger_us))
                    .await?;
            let row = |what: &str, p: &Phase| {
                println!(
                    "{:>7} | {:<22} | {:>9.0} {:>9.2?} {:>9.2?} {:>15} | {:>11.2}x",
                    clients,
                    what,
                    p.rate(),
                    p.p50,
                    p.p99,
                    p.cpu(),
                    create.rate() / p.rate()
                );
            };
            row("Apply: create", &create);
            row("create, basic view", &basic);
            row("Apply: update", &update);
            row("Apply: unchanged", &reapply);
            row("Apply: create, dry run", &dry_run);
            row("Get: vm", &get);
            row("health Check", &floor);
            for (rate, paced) in rates.iter().zip(&paced) {
                let what = if paced_load == Load::CreateBasic {
                    "basic"
                } else {
                    "create"
                };
                row(&format!("{what}, paced {rate}/s"), paced);
            }
            println!(
                "{:>7} | {:<22} | {:>9.0} {:>9} {:>9} {:>15} | {:>11.2}x",
                clients,
                "log append alone",
                log,
                "",
                "",
                "",
                create.rate() / log
            );
        }
        anyhow::Ok(true)
    })?;
    let _ = stop_tx.send(());
    let served = server_rt.block_on(server).context("the server's task")?;
    served.context("the server")?;
    anyhow::ensure!(ran, "the server stopped before it served");
    Ok(())
}
