//! The gRPC listener's connections: how `vmplane serve` accepts, opens, serves and closes them,
//! so that no peer, with a token or without, holds the server's descriptors with connections
//! that say nothing, and no failed accept spins a processor.
//!
//! Reading order:
//! - [`ConnectionArgs`]: `serve`'s flags (`--max-connections`, `--max-connection-idle-seconds`,
//!   `--connection-open-timeout-ms`), and [`Settings`] made of them;
//! - [`raise_fd_limit`] and [`default_max_connections`]: the open-file limit raised to its hard
//!   limit, as the Go runtime does, and the connection cap kept under it;
//! - [`serve`]: the accept loop. It takes a slot (at the cap it stops accepting: the kernel's
//!   backlog holds newcomers) and then a connection; a failed accept backs off and is logged at
//!   most once a second ([`AcceptErrors`]). Each connection runs in a task of its own;
//! - `connection`: that task. A connection must open within the open deadline: its TLS
//!   handshake (with `--tls-cert`), then HTTP/2's 24-byte client preface, read here and handed
//!   back to hyper by [`Opened`]. Then hyper serves it; once it has had no call open for
//!   `--max-connection-idle-seconds`, or the server stops, it gets a GOAWAY (hyper's graceful
//!   shutdown: calls in flight finish, gRPC clients reconnect when they next call), and a peer
//!   that does not answer the GOAWAY is dropped after the open deadline once no call is open;
//! - [`PerConnection`]: the per-connection service in front of the gRPC routes. It counts the
//!   connection's open calls (one increment and one decrement each: a call counts from its
//!   headers until its response body is done, so a watch is never idle; HTTP/2 pings never reach
//!   it) and does what tonic's own server did per request: the client's `grpc-timeout`, the
//!   connection's address in the request's extensions, errors as gRPC statuses.
//!
//! Never: reads a request's content (the routes' services do), or decides a connection's fate
//! from pings, window updates or settings frames (only open calls count as use).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::server::PlainWrites;

/// What a failed call reports to hyper.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP/2 client connection preface (RFC 9113, section 3.4): the first bytes of every
/// gRPC connection, after TLS's handshake when there is one.
pub const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// `--connection-open-timeout-ms`'s default: as long as a TLS handshake may take on either side
/// ([`crate::tls::TLS_HANDSHAKE_TIMEOUT_MS`]).
pub const OPEN_TIMEOUT_MS_DEFAULT: u64 = crate::tls::TLS_HANDSHAKE_TIMEOUT_MS;

/// `--max-connection-idle-seconds`'s default: 5 minutes without an open call.
pub const MAX_CONNECTION_IDLE_SECONDS_DEFAULT: u64 = 300;

/// The first pause after a failed accept; each further failure in a row doubles it, up to
/// [`ACCEPT_BACKOFF_MAX_MS`].
pub const ACCEPT_BACKOFF_MIN_MS: u64 = 50;

/// The longest pause after failed accepts in a row.
pub const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;

/// At most one log line per this many milliseconds for one kind of trouble (failed accepts,
/// the connection cap reached), each saying how many times it happened since the last.
pub const TROUBLE_LOG_INTERVAL_MS: u64 = 1_000;

/// How long an accepted connection may be silent before the kernel probes it (TCP keepalive),
/// and between probes: a peer gone without a word (power lost, network cut) is found after 9
/// unanswered probes (Linux's default), as Go's listeners do, even while it holds a watch open.
pub const TCP_KEEPALIVE_SECONDS: u64 = 15;

/// Descriptors the connection cap leaves to the rest of the server when it is derived from the
/// open-file limit: an eighth of the limit, at least this many...
pub const RESERVED_FDS_MIN: u64 = 64;

/// ...and at most this many (the log's files, libvirt's sockets, the metrics listener, ...).
pub const RESERVED_FDS_MAX: u64 = 4_096;

/// The most connections the cap may allow.
pub const MAX_CONNECTIONS_MAX: u32 = 1 << 20;

/// `vmplane serve`'s flags for its gRPC connections.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ConnectionArgs {
    /// The most gRPC connections served at once; further ones wait in the kernel's listen
    /// backlog until one closes. Default: the open-file limit (which `serve` raises to its hard
    /// limit) less an eighth of it (at least 64, at most 4096 descriptors) for the log, libvirt
    /// and the rest; the `vmplane serving` log line says the figure (`max_connections=`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONNECTIONS_MAX)))]
    pub max_connections: Option<u32>,

    /// Close a connection that has had no call open for this long, with a GOAWAY: gRPC clients
    /// reconnect when they next call. An open watch is a call, so its connection is never
    /// idle; HTTP/2 and TCP keepalive pings are not. 0 never closes one.
    #[arg(long, value_name = "SECONDS", default_value_t = MAX_CONNECTION_IDLE_SECONDS_DEFAULT, value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub max_connection_idle_seconds: u64,

    /// How long an accepted connection may take to open (its TLS handshake with --tls-cert, then
    /// HTTP/2's preface) before it is closed, and a closing one to answer its GOAWAY. A tuning
    /// knob, for slow links; tests shorten it.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = OPEN_TIMEOUT_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub connection_open_timeout_ms: u64,
}

impl Default for ConnectionArgs {
    /// The flags' defaults, as the command line gives them.
    fn default() -> Self {
        ConnectionArgs {
            max_connections: None,
            max_connection_idle_seconds: MAX_CONNECTION_IDLE_SECONDS_DEFAULT,
            connection_open_timeout_ms: OPEN_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// How [`serve`] treats connections: [`ConnectionArgs`] with the cap decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Connections served at once, at most.
    pub max_connections: u32,
    /// How long a connection may take to open, and to answer a GOAWAY.
    pub open_timeout: Duration,
    /// How long a connection may have no call open; `None`: for ever.
    pub max_idle: Option<Duration>,
}

impl Settings {
    /// The settings `args` ask for, the cap derived from `fd_limit` (the open-file limit in
    /// force) when not given.
    pub fn new(args: &ConnectionArgs, fd_limit: u64) -> Settings {
        Settings {
            max_connections: args
                .max_connections
                .unwrap_or_else(|| default_max_connections(fd_limit)),
            open_timeout: Duration::from_millis(args.connection_open_timeout_ms),
            max_idle: (args.max_connection_idle_seconds > 0)
                .then(|| Duration::from_secs(args.max_connection_idle_seconds)),
        }
    }
}

/// The connection cap under an open-file limit of `fd_limit`: the limit less an eighth of it
/// (between [`RESERVED_FDS_MIN`] and [`RESERVED_FDS_MAX`]), at least 1, at most
/// [`MAX_CONNECTIONS_MAX`].
pub fn default_max_connections(fd_limit: u64) -> u32 {
    let limit = fd_limit.min(u64::from(MAX_CONNECTIONS_MAX));
    let reserved = (limit / 8).clamp(RESERVED_FDS_MIN, RESERVED_FDS_MAX);
    u32::try_from(limit.saturating_sub(reserved))
        .unwrap_or(MAX_CONNECTIONS_MAX)
        .max(1)
}

/// The process's open-file limit (`RLIMIT_NOFILE`) before and after [`raise_fd_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit found.
    pub was: u64,
    /// The soft limit now in force.
    pub now: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft open-file limit to the hard limit, as the Go runtime does at start: the
/// soft limit (often 1024) is a compatibility default for `select(2)`, which nothing here uses.
pub fn raise_fd_limit() -> io::Result<FdLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes into the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit(2) reads the struct it is given, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(FdLimit {
        was,
        now: limit.rlim_max.max(was),
        hard: limit.rlim_max,
    })
}

/// [`raise_fd_limit`], logged: the open-file limit now in force (the soft one found when it
/// cannot be raised, or 1024 when it cannot even be read).
pub fn raise_fd_limit_logged() -> u64 {
    match raise_fd_limit() {
        Ok(FdLimit { was, now, hard }) => {
            if now > was {
                tracing::info!(was, now, "open-file limit raised to its hard limit");
            } else {
                tracing::debug!(
                    soft = now,
                    hard,
                    "open-file limit already at its hard limit"
                );
            }
            now
        }
        Err(err) => {
            const ASSUMED: u64 = 1024;
            let mut found = libc::rlimit {
                rlim_cur: ASSUMED,
                rlim_max: ASSUMED,
            };
            // SAFETY: as in `raise_fd_limit`.
            let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut found) } == 0 {
                found.rlim_cur
            } else {
                ASSUMED
            };
            tracing::warn!(%err, soft, "the open-file limit could not be raised to its hard limit");
            soft
        }
    }
}

/// Serves `service` on every connection `listener` accepts (over TLS with `tls`), as
/// `settings` say, until `stop` says true; then stops accepting (the listening socket is
/// closed), sends every connection a GOAWAY, and returns once every connection is closed.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: S,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + Unpin + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let shared = Shared {
        service,
        http2: Arc::new(http2_builder()),
        settings,
    };
    let slots = Arc::new(Semaphore::new(settings.max_connections as usize));
    let mut errors = AcceptErrors::default();
    let mut full = TroubleLog::default();
    loop {
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if let Some(times) = full.happened() {
                    tracing::warn!(
                        max_connections = settings.max_connections,
                        times,
                        "at the connection cap: new connections wait in the listen backlog \
                         until one closes"
                    );
                }
                tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        // Never closed: nothing left to serve with.
                        Err(_) => break,
                    },
                    () = stopped(&mut stop) => break,
                }
            }
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut stop) => break,
        };
        match accepted {
            Ok((tcp, _)) => {
                errors.accepted();
                let (shared, tls, stop) = (shared.clone(), tls.clone(), stop.clone());
                tokio::spawn(async move {
                    connection(tcp, tls, shared, stop).await;
                    drop(slot);
                });
            }
            Err(err) => {
                drop(slot);
                let pause = errors.failed(&err);
                if !pause.is_zero() {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = stopped(&mut stop) => break,
                    }
                }
            }
        }
    }
    drop(listener);
    // Every connection gives its slot back when it closes.
    let _ = slots.acquire_many(settings.max_connections).await;
}

/// Completes once `stop` says true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The HTTP/2 settings tonic's server used (tonic 0.14's `Server::builder()` defaults), but
/// hyper's bound on the streams a peer makes the server reset for its errors (1024, against
/// "MadeYouReset"), which tonic turned off: no limit on concurrent streams per connection (600
/// watches on a few channels is a tested use), no HTTP/2 keepalive pings of the server's own
/// (TCP keepalive finds dead peers at no cost per request: see [`TCP_KEEPALIVE_SECONDS`]).
fn http2_builder() -> hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor> {
    let mut builder =
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(None)
        .adaptive_window(false);
    builder
}

/// What every connection task needs: the service, hyper's settings and ours.
struct Shared<S> {
    service: S,
    http2: Arc<hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor>>,
    settings: Settings,
}

impl<S: Clone> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Shared {
            service: self.service.clone(),
            http2: Arc::clone(&self.http2),
            settings: self.settings,
        }
    }
}

/// How the accept loop meets failed accepts: a pause that grows with the failures in a row
/// (none for a connection the peer reset before it was accepted: that one is gone, the next is
/// fine), and one log line a second at most, with the count.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    in_a_row: u32,
    log: TroubleLog,
}

impl AcceptErrors {
    /// Notes a failed accept (logged when due) and says how long to wait before the next.
    pub fn failed(&mut self, err: &io::Error) -> Duration {
        use io::ErrorKind as K;
        let peers_own = matches!(
            err.kind(),
            K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused
        );
        let pause = if peers_own {
            Duration::ZERO
        } else {
            self.in_a_row = self.in_a_row.saturating_add(1);
            accept_backoff(self.in_a_row)
        };
        if let Some(failures) = self.log.happened() {
            tracing::warn!(
                %err,
                failures,
                pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                "accepting a connection failed"
            );
        }
        pause
    }

    /// Notes an accepted connection: the next failure pauses the least again, and the failures
    /// not logged yet are.
    pub fn accepted(&mut self) {
        self.in_a_row = 0;
        if let Some(failures) = self.log.flush() {
            tracing::info!(
                failures,
                "accepting connections again (after more failed accepts than logged)"
            );
        }
    }
}

/// The pause after the `in_a_row`th failed accept in a row (from 1): [`ACCEPT_BACKOFF_MIN_MS`],
/// doubled for each further one, at most [`ACCEPT_BACKOFF_MAX_MS`].
pub fn accept_backoff(in_a_row: u32) -> Duration {
    let doublings = in_a_row.saturating_sub(1).min(16);
    Duration::from_millis((ACCEPT_BACKOFF_MIN_MS << doublings).min(ACCEPT_BACKOFF_MAX_MS))
}

/// One kind of trouble, logged at most once per [`TROUBLE_LOG_INTERVAL_MS`] with how many
/// times it happened since the last line.
#[derive(Debug, Default)]
struct TroubleLog {
    last_line: Option<Instant>,
    unlogged: u64,
}

impl TroubleLog {
    /// Notes one more time; `Some(times)` when a line is due, `times` counting this one.
    fn happened(&mut self) -> Option<u64> {
        self.happened_at(Instant::now())
    }

    /// [`TroubleLog::happened`] at `now`.
    fn happened_at(&mut self, now: Instant) -> Option<u64> {
        self.unlogged = self.unlogged.saturating_add(1);
        let due = self.last_line.is_none_or(|last| {
            now.duration_since(last) >= Duration::from_millis(TROUBLE_LOG_INTERVAL_MS)
        });
        if !due {
            return None;
        }
        self.last_line = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// The times not logged yet, if any (and none afterwards).
    fn flush(&mut self) -> Option<u64> {
        (self.unlogged > 0).then(|| std::mem::take(&mut self.unlogged))
    }
}

/// `TCP_NODELAY` (small gRPC frames must not wait for Nagle's algorithm and the peer's delayed
/// ACK: 40 ms a request otherwise) and TCP keepalive ([`TCP_KEEPALIVE_SECONDS`]) on an accepted
/// connection.
pub fn tune(tcp: &TcpStream) -> io::Result<()> {
    tcp.set_nodelay(true)?;
    let every = Duration::from_secs(TCP_KEEPALIVE_SECONDS);
    socket2::SockRef::from(tcp).set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(every)
            .with_interval(every),
    )
}

/// Why a connection was closed before it opened (logged at debug: a scanner or a slow peer is
/// no news to the operator, and an attacker must not fill the log).
#[derive(Debug, thiserror::Error)]
enum NotOpened {
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
    #[error("not opened within {0:?} (TLS handshake, then HTTP/2's preface)")]
    TimedOut(Duration),
    #[error("closed before HTTP/2's preface: {0}")]
    Closed(io::Error),
    #[error("did not start with HTTP/2's preface (not a gRPC client)")]
    NotHttp2,
    #[error("the server is stopping")]
    Stopping,
}

/// One accepted connection, from accept to close (see the module's documentation).
async fn connection<S, B>(
    tcp: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Shared<S>,
    mut stop: watch::Receiver<bool>,
) where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + Unpin + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let info = tcp.connect_info();
    let peer = info.remote_addr;
    if let Err(err) = tune(&tcp) {
        tracing::debug!(?peer, %err, "TCP options could not be set: connection closed");
        return;
    }
    let deadline = Instant::now() + shared.settings.open_timeout;
    let opened = match tls {
        None => {
            let mut io = PlainWrites(tcp);
            match open(&mut io, deadline, shared.settings.open_timeout, &mut stop).await {
                Ok(()) => {
                    serve_opened(io, info, shared, stop).await;
                    Ok(())
                }
                Err(err) => Err(err),
            }
        }
        Some(acceptor) => {
            let handshake = async {
                match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => Ok(tls),
                    Ok(Err(err)) => Err(NotOpened::Handshake(err)),
                    Err(_) => Err(NotOpened::TimedOut(shared.settings.open_timeout)),
                }
            };
            let handshake = tokio::select! {
                handshake = handshake => handshake,
                () = stopped(&mut stop) => Err(NotOpened::Stopping),
            };
            match handshake {
                Ok(tls) => {
                    // h2 writes through `PlainWrites` over TLS too: rustls seals the answers a
                    // group commit releases together into one record.
                    let mut io = PlainWrites(tls);
                    match open(&mut io, deadline, shared.settings.open_timeout, &mut stop).await {
                        Ok(()) => {
                            serve_opened(io, info, shared, stop).await;
                            Ok(())
                        }
                        Err(err) => Err(err),
                    }
                }
                Err(err) => Err(err),
            }
        }
    };
    if let Err(err) = opened {
        tracing::debug!(?peer, %err, "connection closed before it opened");
    }
}

/// Reads HTTP/2's client preface from `io` by `deadline` (`timeout` after accept).
async fn open<T: AsyncRead + Unpin>(
    io: &mut T,
    deadline: Instant,
    timeout: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), NotOpened> {
    let mut preface = [0u8; HTTP2_PREFACE.len()];
    let read = tokio::select! {
        read = tokio::time::timeout_at(deadline, io.read_exact(&mut preface)) => read,
        () = stopped(stop) => return Err(NotOpened::Stopping),
    };
    match read {
        Err(_) => Err(NotOpened::TimedOut(timeout)),
        Ok(Err(err)) => Err(NotOpened::Closed(err)),
        Ok(Ok(_)) if &preface == HTTP2_PREFACE => Ok(()),
        Ok(Ok(_)) => Err(NotOpened::NotHttp2),
    }
}

/// Serves an opened connection (its preface read) until it closes: a GOAWAY once it has been
/// idle for `max_idle` or the server stops, and a drop when the peer leaves that unanswered for
/// the open timeout with no call open.
async fn serve_opened<T, S, B>(
    io: T,
    info: TcpConnectInfo,
    shared: Shared<S>,
    mut stop: watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + Unpin + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let peer = info.remote_addr;
    let calls = Arc::new(Calls::new());
    let service = PerConnection {
        inner: shared.service,
        info,
        calls: Arc::clone(&calls),
    };
    let grace = shared.settings.open_timeout;
    let conn = shared
        .http2
        .serve_connection(hyper_util::rt::TokioIo::new(Opened::new(io)), service);
    let mut conn = std::pin::pin!(conn);
    let idle = idle(&calls, shared.settings.max_idle);
    let mut idle = std::pin::pin!(idle);
    // When a GOAWAY was sent: the time by which the peer must have answered it.
    let mut answer_by: Option<Instant> = None;
    loop {
        let unanswered = async move {
            match answer_by {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(?peer, %err, "connection ended with an error");
                }
                return;
            }
            () = &mut idle, if answer_by.is_none() => {
                tracing::debug!(?peer, "connection idle: GOAWAY");
                conn.as_mut().graceful_shutdown();
                answer_by = Some(Instant::now() + grace);
            }
            () = stopped(&mut stop), if answer_by.is_none() => {
                conn.as_mut().graceful_shutdown();
                answer_by = Some(Instant::now() + grace);
            }
            () = unanswered => {
                if calls.open() == 0 {
                    tracing::debug!(?peer, "GOAWAY unanswered: connection closed");
                    return;
                }
                // Calls still finishing: they end the connection, or we look again.
                answer_by = Some(Instant::now() + grace);
            }
        }
    }
}

/// Completes once `calls` have had none open for `max_idle` (never when `None`).
async fn idle(calls: &Calls, max_idle: Option<Duration>) {
    let Some(max_idle) = max_idle else {
        return std::future::pending().await;
    };
    let mut look_at = Instant::now() + max_idle;
    loop {
        tokio::time::sleep_until(look_at).await;
        let now = Instant::now();
        if calls.open() > 0 {
            look_at = now + max_idle;
            continue;
        }
        let idle_until = calls.quiet_since() + max_idle;
        if idle_until <= now {
            return;
        }
        look_at = idle_until;
    }
}

/// A connection's open calls, and since when it has had none.
#[derive(Debug)]
struct Calls {
    open: AtomicUsize,
    born: Instant,
    /// Milliseconds after `born` when the last call ended (0 before any did).
    quiet_since_ms: AtomicU64,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            open: AtomicUsize::new(0),
            born: Instant::now(),
            quiet_since_ms: AtomicU64::new(0),
        }
    }

    /// A call begins; it ends when the returned guard is dropped.
    fn begin(self: &Arc<Self>) -> OpenCall {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenCall(Arc::clone(self))
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    fn quiet_since(&self) -> Instant {
        self.born + Duration::from_millis(self.quiet_since_ms.load(Ordering::Acquire))
    }
}

/// One open call of a connection: from its request's headers until its response body is done
/// (or dropped: the client cancelled, the connection closed).
#[derive(Debug)]
pub struct OpenCall(Arc<Calls>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        let calls = &self.0;
        if calls.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ms = u64::try_from(calls.born.elapsed().as_millis()).unwrap_or(u64::MAX);
            // The latest end wins, whichever thread stores last.
            calls.quiet_since_ms.fetch_max(ms, Ordering::AcqRel);
        }
    }
}

/// The service hyper calls for each request of one connection: counts it as an open call, and
/// does what tonic's own server did before its routes (the connection's address in the
/// request's extensions, as `tonic::Request::remote_addr` reads it; the client's
/// `grpc-timeout`; an error as a gRPC status).
pub struct PerConnection<S> {
    inner: S,
    info: TcpConnectInfo,
    calls: Arc<Calls>,
}

impl<S, B> hyper::service::Service<http::Request<hyper::body::Incoming>> for PerConnection<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Unpin,
    S::Future: Unpin,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<CallBody<B>>;
    type Error = BoxError;
    type Future = Call<S>;

    fn call(&self, request: http::Request<hyper::body::Incoming>) -> Call<S> {
        let open = self.calls.begin();
        let mut request = request.map(tonic::body::Body::new);
        request.extensions_mut().insert(self.info.clone());
        let deadline = client_timeout(request.headers()).map(|t| Box::pin(tokio::time::sleep(t)));
        Call {
            answer: tower::ServiceExt::oneshot(self.inner.clone(), request),
            deadline,
            open: Some(open),
        }
    }
}

/// A request's answer: its response, with the call's [`OpenCall`] moved into the body.
pub struct Call<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    answer: tower::util::Oneshot<S, http::Request<tonic::body::Body>>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    open: Option<OpenCall>,
}

impl<S, B> Future for Call<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>> + Unpin,
    S::Future: Unpin,
    S::Error: Into<BoxError>,
{
    type Output = Result<http::Response<CallBody<B>>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match Pin::new(&mut this.answer).poll(cx) {
            Poll::Ready(Ok(response)) => {
                let open = this.open.take();
                return Poll::Ready(Ok(response.map(|body| CallBody {
                    inner: Some(body),
                    _open: open,
                })));
            }
            Poll::Ready(Err(err)) => return Poll::Ready(as_status(err.into())),
            Poll::Pending => {}
        }
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            // What tonic answers: CANCELLED, "Timeout expired".
            return Poll::Ready(as_status(Box::new(tonic::TimeoutExpired(()))));
        }
        Poll::Pending
    }
}

/// `err` as a trailers-only gRPC answer when tonic knows its status (tonic's `RecoverError`),
/// else passed on (hyper resets the stream).
fn as_status<B>(err: BoxError) -> Result<http::Response<CallBody<B>>, BoxError> {
    let status = tonic::Status::try_from_error(err)?;
    let (parts, ()) = status.into_http::<()>().into_parts();
    Ok(http::Response::from_parts(
        parts,
        CallBody {
            inner: None,
            _open: None,
        },
    ))
}

/// The client's deadline, from its `grpc-timeout` header (`<digits><unit>`, at most 8 digits,
/// unit one of `HMSmun`), as tonic's server read it; `None` when absent or malformed.
fn client_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at_checked(unit_at)?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// A response body that keeps its call open until it is done (dropped); `None` inside: a
/// trailers-only answer, its status in the headers.
pub struct CallBody<B> {
    inner: Option<B>,
    _open: Option<OpenCall>,
}

impl<B: http_body::Body + Unpin> http_body::Body for CallBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        match &mut self.inner {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        )
    }
}

/// An opened connection as hyper reads it: the HTTP/2 preface first (read already, to check
/// that the connection opened), then the connection's own bytes. Writes pass through untouched,
/// [`PlainWrites`]' "no vectored writes" included.
#[derive(Debug)]
pub struct Opened<T> {
    io: T,
    /// How much of [`HTTP2_PREFACE`] hyper has read.
    preface_read: usize,
}

impl<T> Opened<T> {
    /// `io`, whose preface was read off it.
    pub fn new(io: T) -> Opened<T> {
        Opened {
            io,
            preface_read: 0,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Opened<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(rest) = HTTP2_PREFACE.get(self.preface_read..)
            && !rest.is_empty()
        {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.preface_read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Opened<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_defaults_are_the_default_settings() {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            args: ConnectionArgs,
        }
        let parsed = <Serve as clap::Parser>::try_parse_from(["serve"])
            .expect("no arguments")
            .args;
        assert_eq!(parsed, ConnectionArgs::default());
        let settings = Settings::new(&parsed, 20_000);
        assert_eq!(settings.max_idle, Some(Duration::from_secs(300)));
        assert_eq!(settings.open_timeout, Duration::from_secs(10));
        assert_eq!(settings.max_connections, 17_500);
        let off = ConnectionArgs {
            max_connection_idle_seconds: 0,
            max_connections: Some(7),
            ..ConnectionArgs::default()
        };
        let settings = Settings::new(&off, 20_000);
        assert_eq!((settings.max_idle, settings.max_connections), (None, 7));
        for refused in [
            ["--max-connections", "0"],
            ["--connection-open-timeout-ms", "99"],
        ] {
            assert!(
                <Serve as clap::Parser>::try_parse_from(
                    std::iter::once("serve").chain(refused.iter().copied())
                )
                .is_err(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn the_connection_cap_leaves_an_eighth_of_the_fd_limit_between_64_and_4096() {
        assert_eq!(default_max_connections(1024), 1024 - 128);
        assert_eq!(default_max_connections(20_000), 20_000 - 2_500);
        assert_eq!(default_max_connections(256), 256 - 64);
        assert_eq!(default_max_connections(1 << 20), (1 << 20) - 4_096);
        assert_eq!(default_max_connections(u64::MAX), (1 << 20) - 4_096);
        assert_eq!(default_max_connections(64), 1);
        assert_eq!(default_max_connections(0), 1);
    }

    #[test]
    fn failed_accepts_pause_50_ms_doubling_to_1_s_and_a_reset_peer_not_at_all() {
        let pauses: Vec<u64> = (1..=7)
            .map(|n| u64::try_from(accept_backoff(n).as_millis()).expect("ms"))
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(accept_backoff(u32::MAX), Duration::from_secs(1));
        let mut errors = AcceptErrors::default();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(errors.failed(&emfile), Duration::from_millis(50));
        assert_eq!(errors.failed(&emfile), Duration::from_millis(100));
        let reset = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(errors.failed(&reset), Duration::ZERO);
        assert_eq!(errors.failed(&emfile), Duration::from_millis(200));
        errors.accepted();
        assert_eq!(errors.failed(&emfile), Duration::from_millis(50));
    }

    #[test]
    fn trouble_is_logged_once_a_second_with_how_often_it_happened() {
        let mut log = TroubleLog::default();
        let start = Instant::now();
        assert_eq!(log.happened_at(start), Some(1));
        for ms in 0..1000 {
            assert_eq!(log.happened_at(start + Duration::from_millis(ms)), None);
        }
        let second = start + Duration::from_millis(TROUBLE_LOG_INTERVAL_MS);
        assert_eq!(log.happened_at(second), Some(1001));
        assert_eq!(log.happened_at(second), None);
        assert_eq!(log.flush(), Some(1));
        assert_eq!(log.flush(), None);
    }

    #[test]
    fn the_soft_fd_limit_is_raised_to_the_hard_one() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise_fd_limit`.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        // Lowered a little (not below what this test process may hold open), then raised.
        let lowered = libc::rlimit {
            rlim_cur: limit.rlim_max.min(limit.rlim_max / 2 + 512),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as in `raise_fd_limit`.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        let raised = raise_fd_limit().expect("raise");
        assert_eq!(
            raised,
            FdLimit {
                was: lowered.rlim_cur,
                now: limit.rlim_max,
                hard: limit.rlim_max
            }
        );
        let mut now = lowered;
        // SAFETY: as in `raise_fd_limit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, limit.rlim_max);
    }

    #[test]
    fn a_client_timeout_is_read_as_tonic_reads_grpc_timeout() {
        let read = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().expect("header"));
            client_timeout(&headers)
        };
        assert_eq!(read("3S"), Some(Duration::from_secs(3)));
        assert_eq!(read("250m"), Some(Duration::from_millis(250)));
        assert_eq!(read("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(read("1M"), Some(Duration::from_secs(60)));
        assert_eq!(read("7u"), Some(Duration::from_micros(7)));
        assert_eq!(read("9n"), Some(Duration::from_nanos(9)));
        for malformed in ["", "S", "123456789S", "3s", "x3S", "-1S", "3"] {
            assert_eq!(read(malformed), None, "{malformed:?}");
        }
        assert_eq!(client_timeout(&http::HeaderMap::new()), None);
    }

    /// What h2 reads to decide between copying a frame into its write buffer (up to 1 KiB
    /// without vectored writes) and queueing it on its own (past 256 bytes with them): an
    /// accepted connection, as hyper gets it, must say it has none, carry `TCP_NODELAY` and
    /// keepalive, give the preface back first, and pass bytes both ways, a vectored write whole.
    #[tokio::test]
    async fn accepted_connections_report_no_vectored_writes_and_pass_bytes_without_delay() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        tune(&tcp).unwrap();
        assert!(tcp.nodelay().unwrap());
        assert!(socket2::SockRef::from(&tcp).keepalive().unwrap());
        assert_eq!(
            tcp.connect_info().remote_addr(),
            Some(client.local_addr().unwrap())
        );
        let mut io = PlainWrites(tcp);
        client.write_all(HTTP2_PREFACE).await.unwrap();
        let (never, mut stop) = watch::channel(false);
        let deadline = Instant::now() + Duration::from_secs(5);
        open(&mut io, deadline, Duration::from_secs(5), &mut stop)
            .await
            .expect("opened");
        drop(never);
        let mut conn = Opened::new(io);

        assert!(!tokio::io::AsyncWrite::is_write_vectored(&conn));
        conn.write_all(b"answer").await.unwrap();
        let mut got = [0u8; 6];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"answer");
        client.write_all(b"request").await.unwrap();
        let mut got = [0u8; 31];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..24], HTTP2_PREFACE);
        assert_eq!(&got[24..], b"request");
        // A caller that writes vectored anyway (rustls under TLS) has all its buffers written
        // at once, not only the first.
        let parts = [b"one ".as_slice(), b"two ", b"three"];
        let slices = parts.map(std::io::IoSlice::new);
        assert_eq!(conn.write_vectored(&slices).await.unwrap(), 13);
        let mut got = [0u8; 13];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"one two three");
    }

    /// A gRPC service for the in-process tests: every call answers OK at once.
    fn ok_service() -> tower::util::BoxCloneService<
        http::Request<tonic::body::Body>,
        http::Response<tonic::body::Body>,
        std::convert::Infallible,
    > {
        tower::util::BoxCloneService::new(tower::service_fn(
            |_: http::Request<tonic::body::Body>| async { Ok(tonic::Status::ok("").into_http()) },
        ))
    }

    /// Serves [`ok_service`] on a loopback port with `settings` (over TLS with `tls`); the
    /// address and the stop switch.
    async fn start(
        settings: Settings,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(serve(listener, tls, ok_service(), settings, stop_rx));
        (addr, stop_tx)
    }

    const QUICK: Settings = Settings {
        max_connections: 2,
        open_timeout: Duration::from_millis(300),
        max_idle: None,
    };

    /// Reads until the peer closes (Ok) or `within` passes (Err).
    async fn closed_within<T: AsyncRead + Unpin>(
        io: &mut T,
        within: Duration,
    ) -> Result<(), tokio::time::error::Elapsed> {
        tokio::time::timeout(within, async {
            let mut buf = [0u8; 512];
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
    }

    #[tokio::test]
    async fn silent_connections_are_closed_after_the_open_timeout_without_holding_up_others() {
        let (addr, _stop) = start(QUICK, None).await;
        // Two silent connections hold both slots; a third waits in the backlog.
        let mut silent: Vec<TcpStream> = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let started = std::time::Instant::now();
        for conn in &mut silent {
            closed_within(conn, Duration::from_secs(5))
                .await
                .expect("closed after the open timeout");
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(250), "{took:?}");
        // The third was accepted once a slot was free, and closed in its turn: ~2 timeouts.
        assert!(took < Duration::from_secs(3), "{took:?}");
        // A connection that opens is served (h2 answers with its SETTINGS frame).
        let mut client = TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, HTTP2_PREFACE)
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, &[0, 0, 0, 4, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        let mut header = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut header))
            .await
            .expect("an answer")
            .expect("a frame");
        assert_eq!(header[3], 4, "a SETTINGS frame: {header:?}");
    }

    #[tokio::test]
    async fn a_tls_client_that_completes_its_handshake_and_says_nothing_is_closed() {
        let pki = TestPki::new();
        let (addr, _stop) = start(QUICK, Some(pki.acceptor())).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut tls = pki
            .connector()
            .connect(
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
                tcp,
            )
            .await
            .expect("the handshake completes");
        let started = std::time::Instant::now();
        closed_within(&mut tls, Duration::from_secs(5))
            .await
            .expect("closed after the open timeout");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // And one that never starts its handshake.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        closed_within(&mut silent, Duration::from_secs(5))
            .await
            .expect("closed after the open timeout");
    }

    /// A CA-signed certificate for localhost, the server's acceptor and a client trusting the
    /// CA.
    struct TestPki {
        ca: rustls::pki_types::CertificateDer<'static>,
        cert: rustls::pki_types::CertificateDer<'static>,
        key: rustls::pki_types::PrivatePkcs8KeyDer<'static>,
    }

    impl TestPki {
        fn new() -> TestPki {
            use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
            let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca_key = KeyPair::generate().unwrap();
            let ca = ca_params.self_signed(&ca_key).unwrap();
            let issuer = Issuer::new(ca_params, ca_key);
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec!["localhost".into()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            TestPki {
                ca: ca.der().clone(),
                cert: cert.der().clone(),
                key: rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
            }
        }

        fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![self.cert.clone()], self.key.clone_key().into())
                .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        }

        fn connector(&self) -> tokio_rustls::TlsConnector {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca.clone()).unwrap();
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            tokio_rustls::TlsConnector::from(Arc::new(config))
        }
    }
}
