//! Prometheus metrics at `--metrics-listen` (`GET /metrics`), named in Prometheus' conventions,
//! and the tower layer that gives every gRPC request a tracing span and records its count and
//! latency by method and status code (after `status::request_too_large` has given tonic's
//! refusal of an oversized request vmplane's code).
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
//!
//! Gauges are computed when scraped, from the log and the projections: nothing here is a
//! second truth. `vmplane_vms` has a series for every printableStatus (and any other status
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
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
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

/// The `code` label of a gRPC status code: its name as tonic spells it (`Ok`,
/// `InvalidArgument`, …).
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
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

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
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
            "Time from receiving a gRPC request to its response headers, by method and status code",
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
        Metrics {
            registry,
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
        }
    }

    /// Records one finished request.
    pub fn observe_request(&self, method: &'static str, code: &'static str, seconds: f64) {
        let labels = HandledLabels { method, code };
        self.handled.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    /// Refreshes the gauges from the log and the projections, then encodes everything in the
    /// Prometheus text format.
    pub fn scrape(&self, log: &dyn EventLog, projections: &Projections) -> Result<String, String> {
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
/// object), and its count and latency by method and status code.
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
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // Only the server's own methods name a series (and the span): a made-up path is
        // `unknown`, so no request can grow the metrics without bound.
        let method = method_label(request.uri().path());
        let metrics = self.metrics.clone();
        let span = tracing::info_span!(
            "grpc",
            method = %method,
            principal = tracing::field::Empty,
            object = tracing::field::Empty,
        );
        let future = self.inner.call(request);
        Box::pin(
            async move {
                let started = Instant::now();
                let mut result = future.await;
                if let Ok(response) = &mut result {
                    crate::status::request_too_large(response.headers_mut());
                }
                let code = match &result {
                    // A unary success carries its status in the trailers: OK.
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .map_or("Ok", |c| code_label(tonic::Code::from_i32(c))),
                    Err(_) => "Internal",
                };
                let seconds = started.elapsed().as_secs_f64();
                metrics.observe_request(method, code, seconds);
                tracing::debug!(code = %code, seconds, "request done");
                result
            }
            .instrument(span),
        )
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
    fn every_code_is_labelled_by_its_name() {
        for c in 0..=16 {
            let code = tonic::Code::from_i32(c);
            assert_eq!(code_label(code), format!("{code:?}"));
        }
    }
}
