//! Prometheus metrics at `--metrics-listen` (`GET /metrics`), named in Prometheus' conventions,
//! and the tower layer that gives every gRPC request a tracing span and records its count and
//! latency by method and status code (after `status::request_too_large` has given tonic's
//! refusal of an oversized request vmplane's code).
//!
//! A call is counted when it ends, with its final status, as go-grpc-prometheus counts Go's:
//! the `grpc-status` of the trailers that end its response body (a server stream's last word:
//! a failed `Backup` or a watch cut at shutdown is not the `OK` its headers promised), or of its
//! headers when the response is trailers-only (a call refused before any message). Its latency
//! is observed then too, so a stream's is its whole life. A call whose response body is
//! dropped before its end (the client cancelled, the connection went), or whose answer never
//! came, counts as `Canceled`. The `code` label is gRPC's canonical name of the code (Go's
//! `codes.Code.String()`: `OK`, `Canceled`, `InvalidArgument`, …), so dashboards and alerts
//! written for go-grpc-prometheus read these series as they are.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `vmplane_grpc_server_handled_total` | counter | `method`, `code` |
//! | `vmplane_grpc_server_handling_seconds` | histogram | `method`, `code` |
//! | `vmplane_log_head_position` | gauge | |
//! | `vmplane_projection_applied_position` | gauge | |
//! | `vmplane_projection_lag_events` | gauge | |
//! | `vmplane_vms` | gauge | `status` (printableStatus) |
//! | `vmplane_vmi_feature_mismatch` | gauge | |
//! | `vmplane_hypervisor_node_reachable` | gauge | `node` |
//! | `vmplane_log_backend_up` | gauge | |
//!
//! `vmplane_log_backend_up` is 1 while the log's storage answers and 0 while it does not: on
//! etcd, 0 once an operation has gone unanswered for longer than a request's timeout (no
//! quorum, every member down), 1 again at the next answer (the store logs each change, WARN
//! then INFO); an embedded log is always 1.
//! Gauges are computed when scraped, from the log and the projections: nothing here is a
//! second truth. `vmplane_hypervisor_node_reachable` is 1 for a `--hypervisor` node the
//! reconciler's last pass could list and 0 for one it could not (libvirt did not answer); only
//! the server whose reconciler leads has its series ([`set_hypervisor_nodes`], kept up to date
//! by `leader`). `vmplane_vms` has a series for every printableStatus (and any other status
//! seen since start), 0 when no VM has it, so a status does not vanish from the scrape.
//!
//! The `method` label is the request's path only for the methods the server serves (the
//! vmplane services, health and reflection, read from their descriptor sets); any other path
//! is `method="unknown"`, so requests to made-up paths (unauthenticated, before any handler)
//! cannot add series without bound. The exposition is OpenMetrics text (what `prometheus_client` writes, ending in
//! `# EOF`), served with OpenMetrics' content type so a scraper parses it as such.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tracing::Instrument;
use vmplane_core::types::Kind;
use vmplane_projections::Projections;
use vmplane_store::EventLog;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    /// One of [`known_methods`] or [`UNKNOWN_METHOD`]: no label is made per request.
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// Every hypervisor node of the reconciler running in this process, and whether its last pass
/// could list the node (empty while this server's reconciler does not lead).
static HYPERVISOR_NODES: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

/// Publishes the reconciler's nodes and whether each answered its last pass (`leader` calls it
/// while it leads, and with nothing when its term ends).
pub fn set_hypervisor_nodes(nodes: Vec<(String, bool)>) {
    *HYPERVISOR_NODES
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = nodes;
}

/// Whether the log's storage answers, for `vmplane_log_backend_up` (`None`: an embedded log,
/// always up).
type BackendUp = Arc<dyn Fn() -> bool + Send + Sync>;
static LOG_BACKEND_UP: Mutex<Option<BackendUp>> = Mutex::new(None);

/// Tells the metrics how to learn whether the log's storage answers (`server` calls it when it
/// opens an etcd log).
pub fn set_log_backend_up(up: Option<BackendUp>) {
    *LOG_BACKEND_UP
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = up;
}

/// What [`Metrics::scrape`] writes: OpenMetrics text, not Prometheus' older text format
/// (the `_total` suffix only on samples, the closing `# EOF`).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

type LatencyFamily = Family<HandledLabels, Histogram, fn() -> Histogram>;

/// Every metric vmplane exports.
pub struct Metrics {
    registry: Registry,
    handled: Family<HandledLabels, Counter>,
    latency: LatencyFamily,
    log_head: Gauge,
    projection_applied: Gauge,
    projection_lag: Gauge,
    vms: Family<StatusLabels, Gauge>,
    /// Every status `vms` has a series for: each printableStatus, and any other seen.
    vm_statuses: Mutex<BTreeSet<String>>,
    feature_mismatch: Gauge,
    node_reachable: Family<NodeLabels, Gauge>,
    backend_up: Gauge,
}

/// The `method` label of unknown paths.
pub const UNKNOWN_METHOD: &str = "unknown";

/// Every gRPC method the server serves, as request paths (`/vmplane.v1.Objects/Get`): read
/// from the descriptor sets of vmplane's services, health and reflection (v1 and v1alpha).
fn known_methods() -> &'static HashSet<String> {
    static KNOWN: OnceLock<HashSet<String>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        use prost::Message as _;
        let mut methods = HashSet::new();
        for encoded in [
            crate::pb::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ] {
            // Compiled in, so it decodes; if one did not, its methods would be `unknown` (a
            // unit test holds every set decodable).
            let Ok(set) = prost_types::FileDescriptorSet::decode(encoded) else {
                continue;
            };
            for file in &set.file {
                for service in &file.service {
                    for method in &service.method {
                        methods.insert(format!(
                            "/{}.{}/{}",
                            file.package(),
                            service.name(),
                            method.name()
                        ));
                    }
                }
            }
        }
        methods
    })
}

/// The `method` label of a request to `path`: the path when the server serves it, else
/// [`UNKNOWN_METHOD`].
pub fn method_label(path: &str) -> &'static str {
    known_methods()
        .get(path)
        .map_or(UNKNOWN_METHOD, String::as_str)
}

/// The `code` label of a gRPC status code: gRPC's canonical name for it, as Go's
/// `codes.Code.String()` spells it and go-grpc-prometheus labels its series (`OK`, `Canceled`,
/// `InvalidArgument`, …), not tonic's (`Ok`, `Cancelled`): queries written for Go servers then
/// match vmplane's series.
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => CANCELED,
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// The `code` of a call whose response body was dropped before its end, or whose answer never
/// came: its client went away (Go's `codes.Canceled`).
const CANCELED: &str = "Canceled";
/// The `code` of a call whose response ended without a `grpc-status` (a client reads that as
/// an unknown error).
const UNKNOWN: &str = "Unknown";
/// The `code` of a call whose service or response body failed instead of answering.
const INTERNAL: &str = "Internal";

/// The upper bounds of `vmplane_grpc_server_handling_seconds`' buckets: 100 µs to 10 s in
/// Prometheus' 1-2.5-5 steps (the steps of its default buckets, which go-grpc-prometheus uses
/// from 5 ms on), 16 buckets. The bottom resolves the unary calls, most of which answer in well
/// under a millisecond (a health `Check`) to a few (a create's group commit); the top holds what
/// may last seconds and must not all land in `+Inf`: a read with `min_position` waits up to 5 s,
/// and a `Backup` or a watch lasts as long as it streams (a watch of minutes still lands in
/// `+Inf`: its count says how many ended, its sum how long they lasted). Sixteen keeps each
/// series' scrape small: every method and code that occurred has one.
const LATENCY_BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let handled = Family::<HandledLabels, Counter>::default();
        registry.register(
            "vmplane_grpc_server_handled",
            "gRPC requests completed, by method and status code",
            handled.clone(),
        );
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "vmplane_grpc_server_handling_seconds",
            "Time from receiving a gRPC request to the end of its response (a stream's last \
             message and status), by method and final status code",
            latency.clone(),
        );
        let log_head = Gauge::default();
        registry.register(
            "vmplane_log_head_position",
            "Global position of the last committed event",
            log_head.clone(),
        );
        let projection_applied = Gauge::default();
        registry.register(
            "vmplane_projection_applied_position",
            "Last log position the read models have applied",
            projection_applied.clone(),
        );
        let projection_lag = Gauge::default();
        registry.register(
            "vmplane_projection_lag_events",
            "Events committed to the log but not yet applied by the read models",
            projection_lag.clone(),
        );
        let vms = Family::<StatusLabels, Gauge>::default();
        registry.register(
            "vmplane_vms",
            "VirtualMachines by printableStatus",
            vms.clone(),
        );
        let feature_mismatch = Gauge::default();
        registry.register(
            "vmplane_vmi_feature_mismatch",
            "Running VMIs whose spec requests a feature the cluster config has disabled",
            feature_mismatch.clone(),
        );
        let node_reachable = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "vmplane_hypervisor_node_reachable",
            "1 when the reconciler's last pass could list the hypervisor node, 0 when libvirt did \
             not answer (only on the server whose reconciler leads)",
            node_reachable.clone(),
        );
        let backend_up = Gauge::default();
        registry.register(
            "vmplane_log_backend_up",
            "1 when the log's storage answers (on etcd: it answered lately), 0 when it does not",
            backend_up.clone(),
        );
        Metrics {
            registry,
            backend_up,
            handled,
            latency,
            log_head,
            projection_applied,
            projection_lag,
            vms,
            vm_statuses: Mutex::new(
                vmplane_core::lifecycle::PrintableStatus::ALL
                    .iter()
                    .map(|s| s.as_str().to_string())
                    .collect(),
            ),
            feature_mismatch,
            node_reachable,
        }
    }

    /// Sets `vmplane_hypervisor_node_reachable` from [`set_hypervisor_nodes`]' last word.
    fn refresh_hypervisor_nodes(&self) {
        let nodes = HYPERVISOR_NODES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // A node of an ended term (or none at all) has no series.
        self.node_reachable.clear();
        for (node, reachable) in nodes {
            self.node_reachable
                .get_or_create(&NodeLabels { node })
                .set(i64::from(reachable));
        }
    }

    /// Records one finished request: `code` is its final status' [`code_label`].
    pub fn observe_request(&self, method: &'static str, code: &'static str, seconds: f64) {
        let labels = HandledLabels { method, code };
        self.handled.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    /// Refreshes the gauges from the log and the projections, then encodes everything in the
    /// Prometheus text format.
    pub fn scrape(&self, log: &dyn EventLog, projections: &Projections) -> Result<String, String> {
        // First: what follows may fail when the storage does not answer.
        let up = LOG_BACKEND_UP
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.backend_up.set(i64::from(up.is_none_or(|up| up())));
        let head = log.head().0;
        let applied = projections.position().0;
        self.log_head.set(head as i64);
        self.projection_applied.set(applied as i64);
        self.projection_lag.set(head.saturating_sub(applied) as i64);
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        let mut mismatched = 0i64;
        // One VM at a time: a scrape of a large cluster holds no list of every VM.
        projections
            .visit(Kind::VirtualMachine, None, None, |vm| {
                let status = &vm.object["status"];
                let printable = status["printableStatus"]
                    .as_str()
                    .unwrap_or("Unknown")
                    .to_string();
                *counts.entry(printable).or_default() += 1;
                let conditions = status["conditions"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                if conditions.iter().any(|c| {
                    c["type"] == "FeatureMismatch" && c["reason"] == "FeatureDisabledWhileRunning"
                }) {
                    mismatched += 1;
                }
            })
            .map_err(|e| format!("listing VMs: {e}"))?;
        {
            // Every status reported so far keeps its series, at 0 when no VM has it.
            let mut statuses = self
                .vm_statuses
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            statuses.extend(counts.keys().cloned());
            for status in statuses.iter() {
                let count = counts.get(status).copied().unwrap_or(0);
                self.vms
                    .get_or_create(&StatusLabels {
                        status: status.clone(),
                    })
                    .set(count);
            }
        }
        self.feature_mismatch.set(mismatched);
        self.refresh_hypervisor_nodes();

        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| format!("encoding metrics: {e}"))?;
        Ok(out)
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    log: Arc<dyn EventLog>,
    projections: Arc<Projections>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (metrics, log, projections) = (metrics.clone(), log.clone(), projections.clone());
            async move {
                let scraped =
                    tokio::task::spawn_blocking(move || metrics.scrape(log.as_ref(), &projections))
                        .await;
                match scraped {
                    Ok(Ok(text)) => (
                        StatusCode::OK,
                        [("content-type", OPENMETRICS_CONTENT_TYPE)],
                        text,
                    )
                        .into_response(),
                    Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Tower layer: a tracing span per gRPC request (method; handlers record the principal and the
/// object), and its count and latency by method and final status code, recorded when the call
/// ends (see the module's documentation).
#[derive(Clone)]
pub struct MetricsLayer {
    metrics: Arc<Metrics>,
}

impl MetricsLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        MetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`MetricsLayer`] wraps around the gRPC routes.
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for MetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: http_body::Body + Unpin + 'static,
{
    type Response = http::Response<CountedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Only the server's own methods name a series (and the span): a made-up path is
        // `unknown`, so no request can grow the metrics without bound.
        let method = method_label(request.uri().path());
        let span = tracing::info_span!(
            "grpc",
            method = %method,
            principal = tracing::field::Empty,
            object = tracing::field::Empty,
        );
        // Counted as `Canceled` if the answer never comes (this future dropped), else by the
        // response's final status.
        let mut call = Unfinished(Some(Call {
            metrics: self.metrics.clone(),
            method,
            started: Instant::now(),
            span: span.clone(),
        }));
        let future = self.inner.call(request);
        Box::pin(
            async move {
                let mut response = match future.await {
                    Ok(response) => response,
                    Err(err) => {
                        call.finish(INTERNAL);
                        return Err(err);
                    }
                };
                // `method` is the request's path for every method the server serves.
                crate::status::request_too_large(method, response.headers_mut());
                if let Some(code) = status_label(response.headers()) {
                    // Trailers-only (refused before any message): the headers are its end.
                    call.finish(code);
                } else if response.body().is_end_stream() {
                    // Ended with no status at all: no trailers will come to read one from.
                    call.finish(UNKNOWN);
                }
                Ok(response.map(|inner| CountedBody { inner, call }))
            }
            .instrument(span),
        )
    }
}

/// The `code` label of the `grpc-status` in `headers` (a body's trailers, or a trailers-only
/// response's headers): `None` when there is none, [`UNKNOWN`] when it is not a number.
fn status_label(headers: &http::HeaderMap) -> Option<&'static str> {
    let value = headers.get("grpc-status")?;
    let code = value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    Some(code_label(code))
}

/// What recording a call needs once its final status is known. Kept inline in the call's
/// future and then its response body: counting a call at its end allocates nothing.
struct Call {
    metrics: Arc<Metrics>,
    method: &'static str,
    started: Instant,
    /// The request's span, for the "request done" line (its fields: principal, object).
    span: tracing::Span,
}

impl Call {
    /// Counts the call with `code` and observes its latency until now.
    fn finish(self, code: &'static str) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.observe_request(self.method, code, seconds);
        // Inside the span (not merely its child): `RUST_LOG` span directives select by the
        // spans entered.
        self.span
            .in_scope(|| tracing::debug!(code = %code, seconds, "request done"));
    }
}

/// A call not counted yet: counted once, by [`Unfinished::finish`], or as [`CANCELED`] when
/// dropped before that.
struct Unfinished(Option<Call>);

impl Unfinished {
    /// Counts the call with `code`, unless it was counted already.
    fn finish(&mut self, code: &'static str) {
        if let Some(call) = self.0.take() {
            call.finish(code);
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        self.finish(CANCELED);
    }
}

/// A gRPC response body that counts its call when it ends: at its trailers, by their
/// `grpc-status`; at its end without them, as `Unknown`; at an error, as `Internal`; dropped
/// before its end (the client cancelled, the connection closed), as `Canceled`. Its frames pass
/// through untouched.
pub struct CountedBody<B> {
    inner: B,
    call: Unfinished,
}

impl<B: http_body::Body + Unpin> http_body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.call.0.is_some() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        this.call.finish(status_label(trailers).unwrap_or(UNKNOWN));
                    }
                }
                Poll::Ready(Some(Err(_))) => this.call.finish(INTERNAL),
                Poll::Ready(None) => this.call.finish(UNKNOWN),
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_methods_keep_their_path_and_anything_else_is_unknown() {
        for served in [
            "/vmplane.v1.Objects/Get",
            "/vmplane.v1.Objects/Apply",
            "/vmplane.v1.Watch/Watch",
            "/vmplane.v1.Admin/Backup",
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            assert_eq!(method_label(served), served);
        }
        for junk in [
            "/vmplane.v1.Objects/Nope",
            "/x.Y/Z",
            "/",
            "/vmplane.v1.Objects/Get/",
        ] {
            assert_eq!(method_label(junk), UNKNOWN_METHOD, "{junk}");
        }
    }

    #[test]
    fn every_code_is_labelled_by_its_canonical_grpc_name_as_go_spells_it() {
        // Go's `codes.Code.String()`, in the order of the codes' numbers.
        let go = [
            "OK",
            "Canceled",
            "Unknown",
            "InvalidArgument",
            "DeadlineExceeded",
            "NotFound",
            "AlreadyExists",
            "PermissionDenied",
            "ResourceExhausted",
            "FailedPrecondition",
            "Aborted",
            "OutOfRange",
            "Unimplemented",
            "Internal",
            "Unavailable",
            "DataLoss",
            "Unauthenticated",
        ];
        for (c, name) in (0..).zip(go) {
            assert_eq!(code_label(tonic::Code::from_i32(c)), name, "code {c}");
        }
    }

    /// The sample lines of `metrics` whose name and labels start with `series`.
    fn samples(metrics: &Metrics, series: &str) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).expect("encode");
        text.lines()
            .filter(|l| l.starts_with(series))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn each_hypervisor_node_is_reachable_or_not_as_the_reconciler_last_saw_it() {
        let metrics = Metrics::new();
        set_hypervisor_nodes(vec![("good".into(), true), ("remote".into(), false)]);
        metrics.refresh_hypervisor_nodes();
        let mut reachable = samples(&metrics, "vmplane_hypervisor_node_reachable{");
        reachable.sort();
        assert_eq!(
            reachable,
            [
                r#"vmplane_hypervisor_node_reachable{node="good"} 1"#,
                r#"vmplane_hypervisor_node_reachable{node="remote"} 0"#
            ]
        );
        // The term ended: no node is this server's to report.
        set_hypervisor_nodes(Vec::new());
        metrics.refresh_hypervisor_nodes();
        assert!(samples(&metrics, "vmplane_hypervisor_node_reachable{").is_empty());
    }

    /// The count of `method` with `code`, if it has a series.
    fn handled(metrics: &Metrics, method: &str, code: &str) -> Option<String> {
        let series =
            format!(r#"vmplane_grpc_server_handled_total{{method="{method}",code="{code}"}} "#);
        samples(metrics, &series)
            .first()
            .map(|l| l[series.len()..].to_string())
    }

    /// Every `handled_total` sample of `method`.
    fn handled_of(metrics: &Metrics, method: &str) -> Vec<String> {
        samples(
            metrics,
            &format!(r#"vmplane_grpc_server_handled_total{{method="{method}","#),
        )
    }

    /// A response body of `frames`, then its end.
    struct Frames(std::collections::VecDeque<http_body::Frame<tonic::codegen::Bytes>>);

    impl http_body::Body for Frames {
        type Data = tonic::codegen::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// A server stream's response as tonic sends it: headers without a status, `messages`
    /// data frames, then trailers with `grpc-status: status`.
    fn streamed(messages: usize, status: tonic::Code) -> http::Response<Frames> {
        let mut frames: std::collections::VecDeque<_> = (0..messages)
            .map(|_| http_body::Frame::data(tonic::codegen::Bytes::from_static(b"\0\0\0\0\0")))
            .collect();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", (status as i32).into());
        frames.push_back(http_body::Frame::trailers(trailers));
        http::Response::new(Frames(frames))
    }

    /// `metrics`' layer around a service answering every request with `response()`.
    fn layered(
        metrics: &Arc<Metrics>,
        response: fn() -> http::Response<Frames>,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = http::Response<CountedBody<Frames>>,
        Error = std::convert::Infallible,
    > {
        tower::Layer::layer(
            &MetricsLayer::new(Arc::clone(metrics)),
            tower::service_fn(move |_: http::Request<()>| async move {
                Ok::<_, std::convert::Infallible>(response())
            }),
        )
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder()
            .uri(format!("http://vmplane{path}"))
            .body(())
            .expect("request")
    }

    async fn next_frame<B: http_body::Body + Unpin>(
        body: &mut B,
    ) -> Option<Result<http_body::Frame<B::Data>, B::Error>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    const BACKUP: &str = "/vmplane.v1.Admin/Backup";

    #[tokio::test]
    async fn a_stream_that_fails_in_its_trailers_counts_its_final_code_when_its_body_ends() {
        use tower::ServiceExt as _;
        let metrics = Arc::new(Metrics::new());
        let service = layered(&metrics, || streamed(2, tonic::Code::Internal));
        let response = service.oneshot(request(BACKUP)).await.expect("response");
        // Its headers promise nothing: not counted yet, as `OK` or otherwise.
        assert_eq!(handled_of(&metrics, BACKUP), Vec::<String>::new());
        let mut body = response.into_body();
        for _ in 0..2 {
            let frame = next_frame(&mut body).await.expect("a frame").expect("data");
            assert!(frame.is_data());
            assert_eq!(handled_of(&metrics, BACKUP), Vec::<String>::new());
        }
        let trailers = next_frame(&mut body)
            .await
            .expect("trailers")
            .expect("trailers");
        assert!(trailers.is_trailers(), "the trailers pass through");
        assert_eq!(handled(&metrics, BACKUP, "Internal").as_deref(), Some("1"));
        assert!(next_frame(&mut body).await.is_none());
        drop(body);
        // Counted once, with its latency: the end and the drop add nothing.
        assert_eq!(
            handled_of(&metrics, BACKUP).len(),
            1,
            "{:?}",
            handled_of(&metrics, BACKUP)
        );
        let latency = samples(
            &metrics,
            &format!(r#"vmplane_grpc_server_handling_seconds_count{{method="{BACKUP}","#),
        );
        assert_eq!(
            latency,
            [format!(
                r#"vmplane_grpc_server_handling_seconds_count{{method="{BACKUP}",code="Internal"}} 1"#
            )]
        );
    }

    #[tokio::test]
    async fn a_stream_that_ends_well_counts_ok_and_one_dropped_before_its_end_counts_canceled() {
        use tower::ServiceExt as _;
        let metrics = Arc::new(Metrics::new());
        let mut body = layered(&metrics, || streamed(1, tonic::Code::Ok))
            .oneshot(request(BACKUP))
            .await
            .expect("response")
            .into_body();
        while next_frame(&mut body).await.is_some() {}
        assert_eq!(handled(&metrics, BACKUP, "OK").as_deref(), Some("1"));

        let watch = "/vmplane.v1.Watch/Watch";
        let mut body = layered(&metrics, || streamed(3, tonic::Code::Ok))
            .oneshot(request(watch))
            .await
            .expect("response")
            .into_body();
        assert!(next_frame(&mut body).await.is_some());
        assert_eq!(handled_of(&metrics, watch), Vec::<String>::new());
        // The client goes away: hyper drops the body before its trailers.
        drop(body);
        assert_eq!(
            handled_of(&metrics, watch),
            [format!(
                r#"vmplane_grpc_server_handled_total{{method="{watch}",code="Canceled"}} 1"#
            )]
        );
    }

    #[tokio::test]
    async fn a_trailers_only_refusal_counts_at_its_headers_and_a_unary_answer_at_its_trailers() {
        use tonic_health::pb::HealthCheckRequest;
        use tower::ServiceExt as _;
        let metrics = Arc::new(Metrics::new());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let check = "/grpc.health.v1.Health/Check";
        let layer = MetricsLayer::new(Arc::clone(&metrics));
        let call = |service: &str| {
            // One gRPC message: uncompressed, its length, its bytes.
            let message = prost::Message::encode_to_vec(&HealthCheckRequest {
                service: service.into(),
            });
            let mut framed = vec![0u8];
            framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
            framed.extend_from_slice(&message);
            let request = http::Request::builder()
                .method("POST")
                .uri(format!("http://vmplane{check}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(
                    String::from_utf8(framed).expect("ascii"),
                ))
                .expect("request");
            tower::Layer::layer(&layer, health.clone()).oneshot(request)
        };
        // Unknown service: NOT_FOUND in the headers, an empty body no one need read.
        let refused = call("no.such.Service").await.expect("response");
        assert_eq!(handled(&metrics, check, "NotFound").as_deref(), Some("1"));
        drop(refused);
        assert_eq!(
            handled_of(&metrics, check).len(),
            1,
            "{:?}",
            handled_of(&metrics, check)
        );
        // SERVING: tonic's unary answer carries its OK in the trailers, after the message.
        let answered = call("").await.expect("response");
        assert!(answered.headers().get("grpc-status").is_none());
        assert_eq!(handled(&metrics, check, "OK"), None);
        let mut body = answered.into_body();
        while let Some(frame) = next_frame(&mut body).await {
            frame.expect("a frame");
        }
        assert_eq!(handled(&metrics, check, "OK").as_deref(), Some("1"));
    }

    #[test]
    fn a_call_of_seconds_lands_in_a_finite_latency_bucket_up_to_ten_seconds() {
        let metrics = Metrics::new();
        let get = "/vmplane.v1.Objects/Get";
        // A read that waited for its `min_position` (up to 5 s), a stream of seconds.
        metrics.observe_request(get, "OK", 5.2);
        metrics.observe_request(get, "OK", 9.0);
        let bucket = |le: &str| {
            samples(
                &metrics,
                &format!(
                    r#"vmplane_grpc_server_handling_seconds_bucket{{le="{le}",method="{get}",code="OK"}} "#
                ),
            )
        };
        assert!(bucket("5.0")[0].ends_with(" 0"), "{:?}", bucket("5.0"));
        assert!(bucket("10.0")[0].ends_with(" 2"), "{:?}", bucket("10.0"));
        assert!(LATENCY_BUCKETS.len() <= 16);
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
