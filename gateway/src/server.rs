//! `vmplane serve`: opens the log, builds the gRPC services and serves them until SIGTERM or
//! SIGINT.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::api::{Api, REQUEST_BYTES_MAX, RESPONSE_BYTES_MAX};
use crate::auth::Authenticator;
use crate::cli::{Backend, ServeArgs};
use crate::leader::{Leadership, RECONCILER_LEADERSHIP, ReconcilerSupervisor, SupervisorParts};
use crate::metrics::{Metrics, MetricsLayer};
use crate::pb;
use crate::services::AdminService;
use crate::tls::ServerTls;

/// Entry point of `vmplane serve`: sets up logging and a runtime, then serves.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_tracing();
    check_listen_is_allowed(&args)?;
    // Before the runtime and the log: a bad certificate or key refuses the start at once.
    ServerTls::load(args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    let workers = args.worker_threads.unwrap_or_else(default_worker_threads);
    let runtime = runtime(workers).context("start the async runtime")?;
    runtime.block_on(async {
        // Installed before anything is served: a SIGTERM right after the ready line must reach
        // the clean shutdown, not the default action (a handler installed lazily, when a task
        // first polls it, leaves that window open).
        let shutdown = shutdown_signal()?;
        serve(args, shutdown).await
    })
}

/// The async runtime `vmplane serve` serves on, with `workers` worker threads (see
/// [`default_worker_threads`]). Public so that the load generator's in-process server runs as
/// the binary's does.
pub fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    runtime_builder().worker_threads(workers.max(1)).build()
}

/// The runtime's worker threads when `--worker-threads` is not given: one fewer than the
/// processors this process may use ([`std::thread::available_parallelism`]), at least one.
pub fn default_worker_threads() -> usize {
    workers_for(std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

/// One fewer worker than `processors`, at least one. The server has busy threads besides its
/// workers: the log's committer (a sixth of the process's processor time under a write load)
/// and the projection follower. With a worker per processor they outnumber the processors, and
/// the kernel preempts a worker in the middle of a connection's work, whose requests all wait
/// for it. On 2 processors, 1 worker instead of 2 (13 alternated pairs of `gateway-load 64 4
/// file`, medians): creates' p99 5.40 against 5.97 ms (lower in 12 pairs of 13) at 0.99x the
/// rate, dry-run creates' p99 3.9-4.1 against 4.5-4.7 ms, health `Check`s 1.6x/s at half the
/// p99 (PERFORMANCE.md, "The gateway").
fn workers_for(processors: usize) -> usize {
    processors.saturating_sub(1).max(1)
}

/// [`runtime`]'s settings: tokio's multi-threaded scheduler without its LIFO slot.
///
/// With the slot, a task woken or spawned by a worker runs next on that worker, ahead of the
/// tasks already queued, and cannot be stolen by the other worker while it waits there. On a
/// busy 2-core machine a worker is often preempted (by the log's committer, the projection
/// follower or a client), and whatever sits in its slot waits for the kernel to run it again.
/// Without the slot, at 64 clients: 1.05x creates/s and 1.37x no-op health `Check`s/s (LTO);
/// in a build without LTO 1.07x creates/s and the `Check`'s p99 1.8 instead of 4.4 ms
/// (PERFORMANCE.md, "The gateway"). Turning it off needs `--cfg tokio_unstable`
/// (`.cargo/config.toml`); built without it, the runtime keeps tokio's default.
fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("vmplane-rt");
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder
}

/// Logging as `vmplane serve` sets it up: `RUST_LOG` (default `info`) to stderr. Public so that
/// the load generator's in-process server pays for its per-request spans as the binary does.
pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry();
    // A second init (tests calling `run` twice in one process) is harmless.
    let _ = match log_filter(&spec) {
        LogFilter::Targets(targets) => registry.with(targets).with(to_stderr(ansi)).try_init(),
        LogFilter::Env(filter) => registry.with(filter).with(to_stderr(ansi)).try_init(),
    };
}

/// The layer that writes log lines to stderr (colored when `ansi`), under either filter.
fn to_stderr<S>(ansi: bool) -> impl tracing_subscriber::Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
}

/// How `RUST_LOG` filters: by target and level when that is all it says, else with
/// `EnvFilter` (span and field directives, `target[span{field=value}]=level`). Both read the
/// same `target=level` lists alike, but `EnvFilter` also looks every span up in a map shared by
/// all threads each time the span is entered or left, which every request's span pays for on
/// each poll of its future; `Targets` decides once per call site.
#[derive(Debug)]
enum LogFilter {
    Targets(Box<tracing_subscriber::filter::Targets>),
    Env(Box<tracing_subscriber::filter::EnvFilter>),
}

/// The filter for `spec` (`RUST_LOG`'s value): `info` when it is empty or not a filter.
fn log_filter(spec: &str) -> LogFilter {
    use tracing_subscriber::filter::{EnvFilter, Targets};
    let spec = spec.trim();
    let info = || Box::new(Targets::new().with_default(tracing::Level::INFO));
    if spec.is_empty() {
        return LogFilter::Targets(info());
    }
    if spec.contains(['[', '{']) {
        return match EnvFilter::try_new(spec) {
            Ok(filter) => LogFilter::Env(Box::new(filter)),
            Err(_) => LogFilter::Targets(info()),
        };
    }
    LogFilter::Targets(spec.parse::<Targets>().map_or_else(|_| info(), Box::new))
}

/// Without authentication, vmplane only listens on loopback: anyone who can reach the port
/// could otherwise act as the `local` principal.
fn check_listen_is_allowed(args: &ServeArgs) -> anyhow::Result<()> {
    let listen: SocketAddr = args.listen;
    if args.auth.is_none() && !listen.ip().is_loopback() {
        bail!(
            "--listen {listen}: refusing to serve on a non-loopback address without --auth \
             (every request would act as principal `local`); listen on 127.0.0.1 or ::1"
        );
    }
    Ok(())
}

/// How long requests in flight may still finish after the shutdown signal (a watch ends at
/// once, telling its client where to continue, and a health `Watch` once told NOT_SERVING);
/// their connections are closed after it.
const SHUTDOWN_DRAIN_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Opens the log, binds `args.listen`, and serves until `shutdown` completes.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    check_listen_is_allowed(&args)?;
    anyhow::ensure!(
        args.group_commit_linger_us.unwrap_or(0) == 0 || args.backend == Backend::File,
        "--group-commit-linger-us applies to --backend file only (this is --backend {})",
        args.backend.name()
    );
    let tls = ServerTls::load(args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    if let Some(tls) = &tls {
        for warning in tls.warnings() {
            let line = format!("--tls-cert {}: {warning}", tls.cert_path().display());
            tracing::warn!("{line}");
            eprintln!("vmplane: warning: {line}");
        }
    }
    // As the Go runtime does; the connection cap stays under the limit.
    let fd_limit = crate::connections::raise_fd_limit_logged();
    let connections = crate::connections::Settings::new(&args.connections, fd_limit);
    if u64::from(connections.max_connections) + crate::connections::RESERVED_FDS_MIN > fd_limit {
        tracing::warn!(
            max_connections = connections.max_connections,
            fd_limit,
            "--max-connections leaves fewer than {} descriptors of the open-file limit to the \
             rest of the server: accepts may fail for want of one",
            crate::connections::RESERVED_FDS_MIN
        );
    }
    let auth = match &args.auth {
        Some(path) => Some(Arc::new(Authenticator::load(path).context("--auth")?)),
        None => None,
    };
    // Before the log is opened: a refused start leaves no data directory behind.
    probe_hypervisor(&args.hypervisor).await?;
    let metrics_listener = match args.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}: cannot bind"))?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}: cannot bind", args.listen))?;
    let (log, leadership) = open_log(&args).await?;
    let head = log.head();
    let (projections, commands) = {
        let (log, data) = (log.clone(), args.data.clone());
        tokio::task::spawn_blocking(move || open_projections(log, &data))
            .await
            .context("open the projections")??
    };
    // One shutdown signal for every listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Every vmplane service answers SERVING by its name (`grpc.health.v1.Health/Check` with
    // `service: "vmplane.v1.Objects"`), as the overall server ("") does, until the shutdown.
    let health_reporter = tonic_health::server::HealthReporter::new();
    set_health(&health_reporter, ServingStatus::Serving).await;
    let health_service = health_server(&health_reporter, stop_rx.clone());
    {
        let stopping = Arc::clone(&stopping);
        tokio::spawn(async move {
            shutdown.await;
            stop_serving(&health_reporter, &stopping, &stop_tx).await;
        });
    }
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let metrics = Arc::new(Metrics::new());
    let metrics_task = match metrics_listener {
        Some(listener) => {
            let bound = listener.local_addr().context("read the metrics address")?;
            if !bound.ip().is_loopback() {
                tracing::warn!(%bound, "metrics are served without authentication on a non-loopback address");
            }
            eprintln!("vmplane: metrics on http://{bound}/metrics");
            Some(tokio::spawn(crate::metrics::serve_metrics(
                listener,
                metrics.clone(),
                log.clone(),
                projections.clone(),
                stopped(stop_rx.clone()),
            )))
        }
        None => None,
    };
    let stop_follow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = projections
        .follow(stop_follow.clone())
        .context("start the projection follower")?;
    let reconciler = start_reconciler(&args.hypervisor, leadership, &log, projections.clone())?;
    // Snapshots, restores and clones: resumed at start, re-driven on a timer and after writes.
    let sagas = crate::sagas::Sagas::new(commands.clone(), projections.clone());
    let saga_driver = sagas.spawn().context("start the saga driver")?;
    let api = Arc::new(
        Api::new(log.clone(), projections.clone(), commands, auth.clone())
            .with_wake(reconciler.as_ref().map(|(_, wake)| wake.clone()))
            .with_sagas(Some(sagas.clone()))
            .with_stopping(Arc::clone(&stopping)),
    );

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("build the reflection service")?
        .max_decoding_message_size(REQUEST_BYTES_MAX)
        .max_encoding_message_size(RESPONSE_BYTES_MAX);
    // grpcurl 1.8 and Python's grpcio-reflection speak only v1alpha.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("build the reflection service")?
        .max_decoding_message_size(REQUEST_BYTES_MAX)
        .max_encoding_message_size(RESPONSE_BYTES_MAX);

    let local = listener.local_addr().context("read the bound address")?;
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(
        addr = %local,
        tls = tls.is_some(),
        data = %args.data.display(),
        head = head.0,
        workers,
        max_connections = connections.max_connections,
        fd_limit,
        max_connection_idle_seconds = connections.max_idle.map_or(0, |idle| idle.as_secs()),
        "vmplane serving"
    );
    // The ready line: scripts and the test harness wait for it (and read the address that
    // follows "serving gRPC on ").
    let over = if tls.is_some() { " over TLS" } else { "" };
    eprintln!(
        "vmplane: ready: serving gRPC on {local}{over} (data {}, log head {})",
        args.data.display(),
        head.0
    );

    let drain_deadline = {
        let rx = stop_rx.clone();
        async move {
            stopped(rx).await;
            tokio::time::sleep(SHUTDOWN_DRAIN_MAX).await;
        }
    };
    // Every service states its message limits (tonic's defaults, 4 MiB in and no bound out,
    // are nobody's decision): a request at most REQUEST_BYTES_MAX (a manifest at core's limit
    // and its framing; a larger one is refused before any handler, `status::request_too_large`
    // words the refusal), an answer at most RESPONSE_BYTES_MAX.
    let routes = tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            pb::admin_server::AdminServer::new(
                AdminService::new(log.clone(), args.backend.name())
                    .with_auth_and_data(auth.clone(), &args.data),
            )
            .max_decoding_message_size(REQUEST_BYTES_MAX)
            .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .add_service(
            pb::objects_server::ObjectsServer::from_arc(api.clone())
                .max_decoding_message_size(REQUEST_BYTES_MAX)
                .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .add_service(
            pb::lifecycle_server::LifecycleServer::from_arc(api.clone())
                .max_decoding_message_size(REQUEST_BYTES_MAX)
                .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .add_service(
            pb::history_server::HistoryServer::from_arc(api.clone())
                .max_decoding_message_size(REQUEST_BYTES_MAX)
                .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .add_service(
            pb::cluster_server::ClusterServer::from_arc(api.clone())
                .max_decoding_message_size(REQUEST_BYTES_MAX)
                .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .add_service(
            pb::watch_server::WatchServer::from_arc(api.clone())
                .max_decoding_message_size(REQUEST_BYTES_MAX)
                .max_encoding_message_size(RESPONSE_BYTES_MAX),
        )
        .prepare();
    let grpc = tower::Layer::layer(&MetricsLayer::new(metrics.clone()), routes);
    // Connections are accepted, opened (TLS too: the stream h2 writes to is `PlainWrites` over
    // TLS as well) and served by `connections`, not tonic's server: a connection must open within
    // a deadline, and one with no call open for a while is closed (see there).
    let serving = crate::connections::serve(
        listener,
        tls.as_ref().map(ServerTls::acceptor),
        grpc,
        connections,
        stop_rx,
    );
    tokio::select! {
        () = serving => {}
        () = drain_deadline => tracing::warn!(
            "requests still open {}s after the shutdown signal: closing their connections",
            SHUTDOWN_DRAIN_MAX.as_secs()
        ),
    }
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    // Stop the reconciler first: it records through the command path.
    // The saga driver appends through the command path too.
    let _ = tokio::task::spawn_blocking(move || drop(saga_driver)).await;
    if let Some((reconciler, _)) = reconciler {
        // Resigns the leadership too, so another server takes over at once.
        let _ = tokio::task::spawn_blocking(move || reconciler.stop()).await;
    }
    stop_follow.store(true, std::sync::atomic::Ordering::Release);
    let _ = tokio::task::spawn_blocking(move || {
        let _ = follower.join();
        // A last checkpoint so the next start replays only what comes after.
        if let Err(err) = projections.checkpoint() {
            tracing::warn!(%err, "could not write the projection checkpoint at shutdown");
        }
    })
    .await;
    tracing::info!("vmplane stopped");
    Ok(())
}

/// The names the health service answers for: the server as a whole (`""`) and each vmplane
/// service.
const HEALTH_NAMES: [&str; 7] = [
    "",
    pb::admin_server::SERVICE_NAME,
    pb::objects_server::SERVICE_NAME,
    pb::lifecycle_server::SERVICE_NAME,
    pb::history_server::SERVICE_NAME,
    pb::cluster_server::SERVICE_NAME,
    pb::watch_server::SERVICE_NAME,
];

/// Sets every name of [`HEALTH_NAMES`] to `status` (watchers of each are told).
async fn set_health(reporter: &tonic_health::server::HealthReporter, status: ServingStatus) {
    for name in HEALTH_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// The shutdown, in order: every health name NOT_SERVING first, so that load balancers (and
/// every open health `Watch`) hear it while the server still answers and stop sending it
/// traffic; then `stopping` (open vmplane watches end: they would hold the graceful shutdown
/// open) and `stop` (the health watches end, the listeners stop taking requests and the ones in
/// flight finish).
async fn stop_serving(
    health: &tonic_health::server::HealthReporter,
    stopping: &std::sync::atomic::AtomicBool,
    stop: &tokio::sync::watch::Sender<bool>,
) {
    set_health(health, ServingStatus::NotServing).await;
    stopping.store(true, std::sync::atomic::Ordering::Release);
    let _ = stop.send(true);
}

/// The standard health service over `reporter`'s statuses, its `Watch` streams ended once
/// `stop` says true (see [`EndingHealth`]).
fn health_server(
    reporter: &tonic_health::server::HealthReporter,
    stop: tokio::sync::watch::Receiver<bool>,
) -> HealthServer<EndingHealth> {
    HealthServer::new(EndingHealth {
        inner: tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
        stop,
    })
    .max_decoding_message_size(REQUEST_BYTES_MAX)
    .max_encoding_message_size(RESPONSE_BYTES_MAX)
}

/// tonic-health's service, whose `Watch` streams end when the server stops. Left to itself a
/// `Watch` never ends (it waits for the next change of status), so every open one held the
/// graceful shutdown for its whole drain bound ([`SHUTDOWN_DRAIN_MAX`]). `Check` is tonic-health's
/// own, called as it is: no second boxed future on the path of the cheapest request.
struct EndingHealth {
    inner: tonic_health::server::HealthService,
    stop: tokio::sync::watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Health for EndingHealth {
    fn check<'life0, 'async_trait>(
        &'life0 self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> std::pin::Pin<
        Box<
            dyn Future<Output = Result<tonic::Response<HealthCheckResponse>, tonic::Status>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.inner.check(request)
    }

    type WatchStream = EndingWatch;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<EndingWatch>, tonic::Status> {
        let statuses: HealthStatuses = match self.inner.watch(request).await {
            Ok(statuses) => Box::pin(statuses.into_inner()),
            // The health protocol: a name the server does not know is SERVICE_UNKNOWN, and the
            // call stays open (tonic-health refuses it with NOT_FOUND).
            Err(status) if status.code() == tonic::Code::NotFound => {
                use tokio_stream::StreamExt as _;
                let unknown = HealthCheckResponse {
                    status: tonic_health::pb::health_check_response::ServingStatus::ServiceUnknown
                        as i32,
                };
                Box::pin(tokio_stream::once(Ok(unknown)).chain(tokio_stream::pending()))
            }
            Err(status) => return Err(status),
        };
        let mut stop = self.stop.clone();
        Ok(tonic::Response::new(EndingWatch {
            statuses,
            stop: Box::pin(async move {
                // A closed channel (the server gone) ends the watch too.
                let _ = stop.wait_for(|stop| *stop).await;
            }),
            ended: false,
        }))
    }
}

/// The statuses a health `Watch` reports, until the server stops.
type HealthStatuses = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>,
>;

/// A health `Watch` stream that ends when the server stops: first every status set before the
/// stop (the NOT_SERVING of [`stop_serving`]), then `UNAVAILABLE`, which tells a client to
/// watch again elsewhere.
struct EndingWatch {
    statuses: HealthStatuses,
    stop: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl tokio_stream::Stream for EndingWatch {
    type Item = Result<HealthCheckResponse, tonic::Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        // The statuses first: one set before the stop is delivered before the end.
        if let Poll::Ready(status) = self.statuses.as_mut().poll_next(cx) {
            return Poll::Ready(status);
        }
        match self.stop.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.ended = true;
                Poll::Ready(Some(Err(tonic::Status::unavailable(
                    "the server is shutting down",
                ))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A connection that reports no vectored writes, so that h2 copies each frame of up to 1 KiB
/// into its 16 KiB write buffer instead of queueing it as a buffer of its own. The server wraps
/// every accepted connection in it; the load generator its clients' connections.
///
/// h2 queues ("chains") a DATA frame's payload rather than copying it when it is larger than
/// 256 bytes on an I/O with vectored writes, 1 KiB on one without; and it buffers no further
/// frame behind a queued one until that one is written. The answers of a group commit are
/// released together, and a create's answer (~800 bytes with the whole object) is past 256
/// bytes: on a `TcpStream` as it is, the answers multiplexed on one connection leave in one
/// `writev` each; through this wrapper they leave together in one `write`. The cost: a frame
/// larger than 1 KiB leaves in two `write`s (the buffer, then the frame) instead of one
/// `writev` — a large answer, where one more system call weighs little.
#[derive(Debug)]
pub struct PlainWrites<T>(pub T);

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for PlainWrites<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for PlainWrites<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }

    /// The inner stream's own: the hint below says "none" for h2's sake, but a writer that
    /// calls this whatever the hint says (rustls writing its records under tonic's TLS) still
    /// gets one `writev` for all its buffers, not one `write` for the first.
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    /// Deliberately `false` (the trait's default, stated): see the type's documentation.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected
    for PlainWrites<T>
{
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

/// Which embedded backend's log `data` holds, if either's: sled keeps its `db` file there, the
/// file backend its `events.vpl`.
pub fn embedded_backend_of(data: &std::path::Path) -> Option<Backend> {
    if data.join(vmplane_store::file_log::LOG_FILE).exists() {
        Some(Backend::File)
    } else if data.join("db").exists() {
        Some(Backend::Sled)
    } else {
        None
    }
}

/// Opens an embedded log in `--data` with `open`, on a blocking thread (opening reads the log).
async fn open_embedded<L: Send + 'static>(
    args: &ServeArgs,
    open: impl FnOnce(&std::path::Path) -> vmplane_store::Result<L> + Send + 'static,
) -> anyhow::Result<L> {
    let dir = args.data.clone();
    tokio::task::spawn_blocking(move || open(&dir))
        .await
        .context("open the log")?
        .with_context(|| format!("--data {}: cannot open the log", args.data.display()))
}

/// The file log's options `serve` gives it: its defaults, with the committer's linger from
/// `--group-commit-linger-us` (`linger_us`) when given.
pub fn file_options(linger_us: Option<u64>) -> vmplane_store::FileOptions {
    let defaults = vmplane_store::FileOptions::default();
    vmplane_store::FileOptions {
        group_commit_linger: linger_us.map_or(
            defaults.group_commit_linger,
            std::time::Duration::from_micros,
        ),
        ..defaults
    }
}

/// Opens the log on a blocking thread (sled's open does I/O and may panic on damaged files;
/// the store turns that panic into an error), and where the reconciler's leadership comes from.
async fn open_log(
    args: &ServeArgs,
) -> anyhow::Result<(Arc<dyn vmplane_store::EventLog>, Leadership)> {
    if let Some(found) = embedded_backend_of(&args.data)
        && args.backend != Backend::Etcd
        && found != args.backend
    {
        bail!(
            "--data {} holds a {} log, not a {} one: serve it with --backend {}, or move a \
             backup into --backend {} with `vmplane admin restore --backend {}`",
            args.data.display(),
            found.name(),
            args.backend.name(),
            found.name(),
            args.backend.name(),
            args.backend.name()
        );
    }
    match args.backend {
        Backend::File => {
            let options = file_options(args.group_commit_linger_us);
            let log = open_embedded(args, move |dir| {
                vmplane_store::FileLog::open_with(dir, options)
            })
            .await?;
            let report = log.open_report();
            if report.torn_tail_bytes > 0 {
                eprintln!(
                    "vmplane: the log ended in a partly written record of {} bytes (a commit \
                     never acknowledged, cut short by a crash): cut off",
                    report.torn_tail_bytes
                );
            }
            let log = Arc::new(log);
            let fences = Arc::clone(&log);
            Ok((
                log,
                Leadership::Local(Arc::new(move |name: &str| fences.take_fence(name))),
            ))
        }
        Backend::Sled => {
            let options = vmplane_store::SledOptions {
                cache_capacity_bytes: args.log_cache_mib << 20,
                ..vmplane_store::SledOptions::default()
            };
            let log = open_embedded(args, move |dir| {
                vmplane_store::SledLog::open_with(dir, options)
            })
            .await?;
            let log = Arc::new(log);
            // Requests submit their appends to the committer thread instead of each parking a
            // blocking thread until its commit.
            log.start_committer()
                .with_context(|| format!("--data {}: cannot start the log", args.data.display()))?;
            let fences = Arc::clone(&log);
            Ok((
                log,
                Leadership::Local(Arc::new(move |name: &str| fences.take_fence(name))),
            ))
        }
        Backend::Etcd => {
            let mut options = vmplane_store_etcd::EtcdOptions::new(
                args.etcd_endpoints.clone(),
                args.etcd_prefix.clone(),
            );
            options.txn_ops_max = usize::try_from(args.etcd_max_txn_ops)
                .context("--etcd-max-txn-ops does not fit this machine's word")?;
            let shown = args.etcd_endpoints.join(",");
            let log =
                tokio::task::spawn_blocking(move || vmplane_store_etcd::EtcdLog::open(options))
                    .await
                    .context("open the log")?
                    .with_context(|| format!("--etcd-endpoints {shown}: cannot open the log"))?;
            let holder = format!(
                "vmplane pid {} data {}",
                std::process::id(),
                args.data.display()
            );
            let election = log
                .election(
                    RECONCILER_LEADERSHIP,
                    std::time::Duration::from_secs(args.leader_lease_seconds),
                    holder,
                )
                .context("--leader-lease-seconds")?;
            let log = Arc::new(log);
            // `vmplane_log_backend_up`: whether etcd answered lately (a weak reference: the
            // metrics keep no log open).
            let watched = Arc::downgrade(&log);
            crate::metrics::set_log_backend_up(Some(Arc::new(move || {
                watched.upgrade().is_none_or(|log| log.backend_up())
            })));
            Ok((log, Leadership::Etcd(Box::new(election))))
        }
    }
}

type Opened = (
    Arc<vmplane_projections::Projections>,
    Arc<vmplane_projections::command::CommandHandler>,
);

/// Loads the projections' checkpoint (replaying only the tail) and builds the command path on
/// the same state cache.
fn open_projections(
    log: Arc<dyn vmplane_store::EventLog>,
    data: &std::path::Path,
) -> anyhow::Result<Opened> {
    use vmplane_projections::command::{CommandHandler, CommandOptions};
    let projections = vmplane_projections::Projections::open(log.clone(), data, Default::default())
        .with_context(|| format!("--data {}: cannot build the projections", data.display()))?;
    let commands = CommandHandler::new(log, projections.cache().clone(), CommandOptions::default());
    Ok((Arc::new(projections), Arc::new(commands)))
}

/// `--hypervisor` values as `NAME=URI` (a bare URI becomes `node1`, `node2`, …), or `None`
/// for `none`.
pub fn node_args(values: &[String]) -> anyhow::Result<Option<Vec<String>>> {
    if values.iter().any(|v| v == "none") {
        if values.len() > 1 {
            bail!("--hypervisor none: cannot be combined with other --hypervisor values");
        }
        return Ok(None);
    }
    let mut out = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let named = match (v.find('='), v.find("://")) {
            (Some(eq), Some(scheme)) => eq < scheme,
            (Some(_), None) => true,
            _ => false,
        };
        out.push(if named {
            v.clone()
        } else {
            format!("node{}={v}", i + 1)
        });
    }
    Ok(Some(out))
}

/// Starts the reconciler's supervisor: it campaigns for the reconciler's leadership and runs
/// the reconciler (on threads of its own, libvirt nodes opened per term) only while this server
/// leads (see [`crate::leader`]). `None` for `--hypervisor none`.
/// Opens every `--hypervisor` node once before serving (on a blocking thread), so that a URI
/// that cannot be opened (a typo, a missing file, libvirt not running there) stops `serve` at
/// once with the reason, rather than leaving a server that says it is ready while its
/// reconciler fails every second. The reconciler opens its own connections when it leads.
async fn probe_hypervisor(values: &[String]) -> anyhow::Result<()> {
    let Some(nodes) = node_args(values)? else {
        return Ok(());
    };
    let shown = nodes.join(" ");
    tokio::task::spawn_blocking(move || vmplane_hypervisor::Nodes::open(&nodes).map(drop))
        .await
        .context("open the hypervisor nodes")?
        .map_err(|e| {
            // `e` says its causes in its own text: one line, the hint last.
            anyhow::anyhow!(
                "--hypervisor {shown}: cannot open: {e} ({}; `--hypervisor none` serves \
                 without a reconciler)",
                e.hint()
            )
        })
}

fn start_reconciler(
    values: &[String],
    leadership: Leadership,
    log: &Arc<dyn vmplane_store::EventLog>,
    projections: Arc<vmplane_projections::Projections>,
) -> anyhow::Result<Option<(ReconcilerSupervisor, vmplane_hypervisor::WakeHandle)>> {
    let Some(nodes) = node_args(values)? else {
        tracing::info!("--hypervisor none: no reconciler");
        return Ok(None);
    };
    let wake = vmplane_hypervisor::WakeHandle::default();
    let parts = SupervisorParts {
        log: log.clone(),
        projections,
        nodes,
        wake: wake.clone(),
    };
    let supervisor = ReconcilerSupervisor::spawn(leadership, parts)?;
    Ok(Some((supervisor, wake)))
}

/// Installs the SIGTERM and SIGINT handlers now; the future completes on either signal.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::Level;

    use super::{LogFilter, log_filter};

    #[test]
    fn rust_log_lists_of_targets_and_levels_filter_without_envfilter_and_span_directives_with_it() {
        let targets = |spec: &str| match log_filter(spec) {
            LogFilter::Targets(targets) => targets,
            LogFilter::Env(filter) => panic!("{spec:?} gave EnvFilter {filter}"),
        };
        for unset in ["", "  ", "no=such=level"] {
            let t = targets(unset);
            assert!(
                t.would_enable("vmplane_gateway::server", &Level::INFO),
                "{unset:?}"
            );
            assert!(!t.would_enable("h2::proto", &Level::DEBUG), "{unset:?}");
        }
        let t = targets("warn,vmplane_gateway=debug");
        assert!(t.would_enable("vmplane_gateway::metrics", &Level::DEBUG));
        assert!(!t.would_enable("vmplane_gateway::metrics", &Level::TRACE));
        assert!(t.would_enable("h2::proto", &Level::WARN));
        assert!(!t.would_enable("h2::proto", &Level::INFO));
        let t = targets("vmplane_store=trace");
        assert!(t.would_enable("vmplane_store::file_log", &Level::TRACE));
        assert!(!t.would_enable("vmplane_gateway", &Level::ERROR));
        for spans in [
            "info,[grpc]=debug",
            "[grpc{method=/vmplane.v1.Objects/Apply}]=trace",
        ] {
            assert!(
                matches!(log_filter(spans), LogFilter::Env(_)),
                "{spans:?} needs EnvFilter"
            );
        }
    }

    /// The order in which tasks spawned from one task run on a single worker: with tokio's
    /// LIFO slot the last one spawned runs first; without it, the order they were spawned in.
    fn order_of_spawned_tasks() -> Vec<u32> {
        let runtime = super::runtime(1).expect("runtime");
        let ran = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&ran);
        runtime.block_on(async move {
            tokio::spawn(async move {
                let handles: Vec<_> = (1..=3)
                    .map(|i| {
                        let seen = Arc::clone(&seen);
                        tokio::spawn(async move { seen.lock().expect("order").push(i) })
                    })
                    .collect();
                for handle in handles {
                    handle.await.expect("task");
                }
            })
            .await
            .expect("spawner");
        });
        ran.lock().expect("order").clone()
    }

    #[test]
    fn the_runtime_leaves_one_processor_to_the_committer_and_follower_and_keeps_one_worker() {
        assert_eq!(super::workers_for(0), 1);
        assert_eq!(super::workers_for(1), 1);
        assert_eq!(super::workers_for(2), 1);
        assert_eq!(super::workers_for(8), 7);
        let processors = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(
            super::default_worker_threads(),
            processors.saturating_sub(1).max(1)
        );
        for workers in [1, 3] {
            let runtime = super::runtime(workers).expect("runtime");
            assert_eq!(runtime.metrics().num_workers(), workers);
        }
    }

    /// `serve`'s arguments as the command line gives them.
    fn serve_args(args: &[&str]) -> crate::cli::ServeArgs {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: crate::cli::ServeArgs,
        }
        let line = std::iter::once("serve").chain(args.iter().copied());
        <Serve as clap::Parser>::try_parse_from(line)
            .expect("arguments")
            .args
    }

    #[test]
    fn the_file_log_lingers_150_us_for_company_unless_the_flag_says_otherwise() {
        use std::time::Duration;
        let linger = |args: &[&str]| {
            super::file_options(serve_args(args).group_commit_linger_us).group_commit_linger
        };
        assert_eq!(linger(&["--backend", "file"]), Duration::from_micros(150));
        assert_eq!(
            linger(&["--backend", "file", "--group-commit-linger-us", "0"]),
            Duration::ZERO
        );
        assert_eq!(
            linger(&["--backend", "file", "--group-commit-linger-us", "400"]),
            Duration::from_micros(400)
        );
        // Only what the user gave counts as given: the default is not a flag sled refuses.
        assert_eq!(serve_args(&[]).group_commit_linger_us, None);
    }

    /// A health service with every name SERVING, its reporter and its stop signal.
    async fn serving_health() -> (
        tonic_health::server::HealthReporter,
        tokio::sync::watch::Sender<bool>,
        super::EndingHealth,
    ) {
        let reporter = tonic_health::server::HealthReporter::new();
        super::set_health(&reporter, tonic_health::ServingStatus::Serving).await;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let health = super::EndingHealth {
            inner: tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
            stop: stop_rx,
        };
        (reporter, stop_tx, health)
    }

    #[tokio::test]
    async fn the_shutdown_tells_every_health_watch_not_serving_then_ends_it() {
        use tokio_stream::StreamExt as _;
        use tonic_health::pb::health_check_response::ServingStatus as Wire;
        use tonic_health::pb::health_server::Health as _;
        let (reporter, stop_tx, health) = serving_health().await;
        let ask = |name: &str| {
            tonic::Request::new(tonic_health::pb::HealthCheckRequest {
                service: name.into(),
            })
        };
        let mut watches = Vec::new();
        for name in super::HEALTH_NAMES {
            let mut watch = health.watch(ask(name)).await.expect("watch").into_inner();
            let now = watch.next().await.expect("a status").expect("a status");
            assert_eq!(now.status(), Wire::Serving, "{name:?}");
            watches.push((name, watch));
        }
        let stopping = std::sync::atomic::AtomicBool::new(false);
        super::stop_serving(&reporter, &stopping, &stop_tx).await;
        assert!(stopping.load(std::sync::atomic::Ordering::Acquire));
        for (name, mut watch) in watches {
            let last = watch.next().await.expect("a status").expect("a status");
            assert_eq!(last.status(), Wire::NotServing, "{name:?}");
            let end = watch.next().await.expect("an end").expect_err("an error");
            assert_eq!(end.code(), tonic::Code::Unavailable, "{name:?}");
            assert!(watch.next().await.is_none(), "{name:?}");
        }
        // While the requests in flight drain, a `Check` says NOT_SERVING (the name is still
        // known), and a `Watch` opened now says so, then ends at once.
        let checked = health.check(ask("")).await.expect("check").into_inner();
        assert_eq!(checked.status(), Wire::NotServing);
        let mut late = health.watch(ask("")).await.expect("watch").into_inner();
        let now = late.next().await.expect("a status").expect("a status");
        assert_eq!(now.status(), Wire::NotServing);
        let end = late.next().await.expect("an end").expect_err("an error");
        assert_eq!(end.code(), tonic::Code::Unavailable);
        assert!(late.next().await.is_none());
    }

    #[tokio::test]
    async fn a_health_watch_of_an_unknown_name_says_service_unknown_and_stays_open() {
        use tokio_stream::StreamExt as _;
        use tonic_health::pb::health_check_response::ServingStatus as Wire;
        use tonic_health::pb::health_server::Health as _;
        let (reporter, stop_tx, health) = serving_health().await;
        let mut watch = health
            .watch(tonic::Request::new(tonic_health::pb::HealthCheckRequest {
                service: "nope".into(),
            }))
            .await
            .expect("a watch, not NOT_FOUND")
            .into_inner();
        let first = watch.next().await.expect("a status").expect("a status");
        assert_eq!(first.status(), Wire::ServiceUnknown);
        let open = tokio::time::timeout(std::time::Duration::from_millis(100), watch.next()).await;
        assert!(open.is_err(), "the call stays open: {open:?}");
        let stopping = std::sync::atomic::AtomicBool::new(false);
        super::stop_serving(&reporter, &stopping, &stop_tx).await;
        let end = watch.next().await.expect("an end").expect_err("an error");
        assert_eq!(end.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn the_server_runtime_runs_spawned_tasks_in_order_without_the_lifo_slot() {
        assert_eq!(
            order_of_spawned_tasks(),
            vec![1, 2, 3],
            "the last task spawned ran first: the LIFO slot is on (built without the \
             tokio_unstable cfg? .cargo/config.toml sets it; a RUSTFLAGS variable replaces it)"
        );
    }
}
