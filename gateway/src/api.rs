//! The gRPC services of `vmplane.v1`: objects, lifecycle, history/audit and watch.
//!
//! Every handler: authenticates the caller (bearer token, or principal `local` without
//! `--auth`), authorizes the namespace it touches before it reads anything (a refused request
//! reveals nothing of the object), runs storage and projection calls on blocking threads, and
//! converts between protobuf and `core`/`projections` types here, at the edge.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_stream::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use vmplane_core::selector::LabelSelector;
use vmplane_core::types::{Kind, Manifest, parse_manifest};
use vmplane_core::{ObjectCommand, Rejection, VmCommand, VmiCommand};
use vmplane_projections::command::{
    AsyncExecuted, Command, CommandError, CommandHandler, CommandMeta, Executed, Preconditions,
};
use vmplane_projections::render::{self, ObjectJson};
use vmplane_projections::watch::WatchFilter;
use vmplane_projections::{At, ObjectView, Projections, Snapshot};
use vmplane_store::threads::{Policy, keep_this_thread_under};
use vmplane_store::{EventLog, Position, Timestamp};

use crate::auth::{Access, Authenticator, Principal};
use crate::loads::StateLoads;
use crate::pb;
use crate::status;

/// Largest request the server decodes, in bytes: a manifest at core's limit plus framing.
pub const REQUEST_BYTES_MAX: usize = vmplane_core::limits::MANIFEST_BYTES_MAX + 64 * 1024;
/// Largest response the server sends, in bytes (a big list).
pub const RESPONSE_BYTES_MAX: usize = 64 << 20;
/// Watch events buffered per client before the server waits for it to read.
pub const WATCH_BUFFER_EVENTS_MAX: usize = 1024;
/// Audit entries returned at most, whatever the request asks.
pub const AUDIT_ENTRIES_MAX: usize = 100_000;

/// Shared state of every service.
pub struct Api {
    log: Arc<dyn EventLog>,
    projections: Arc<Projections>,
    commands: Arc<CommandHandler>,
    /// Reads of states missing from the state cache, for applies (see [`crate::loads`]).
    loads: StateLoads,
    auth: Option<Arc<Authenticator>>,
    read_wait: Duration,
    wake: Option<vmplane_hypervisor::WakeHandle>,
    sagas: Option<Arc<crate::sagas::Sagas>>,
    /// Set when the server is shutting down: open watches end (a server stream would
    /// otherwise hold the graceful shutdown open for as long as its client stays).
    stopping: Arc<AtomicBool>,
    /// The log's head as it moves ([`head_signal`]), which idle watches await.
    heads: tokio::sync::watch::Receiver<u64>,
}

impl Api {
    /// Services over `projections` and `commands`; `auth` `None` means every request acts as
    /// principal `local` (admin).
    pub fn new(
        log: Arc<dyn EventLog>,
        projections: Arc<Projections>,
        commands: Arc<CommandHandler>,
        auth: Option<Arc<Authenticator>>,
    ) -> Api {
        Api {
            heads: head_signal(Arc::clone(&log)),
            log,
            projections,
            loads: StateLoads::new(Arc::clone(&commands)),
            commands,
            auth,
            read_wait: Duration::from_secs(10),
            wake: None,
            stopping: Arc::new(AtomicBool::new(false)),
            sagas: None,
        }
    }

    /// Runs snapshots, restores and clones applied through `apply` as sagas
    /// ([`crate::sagas`]), and pokes their driver after every accepted write.
    pub fn with_sagas(mut self, sagas: Option<Arc<crate::sagas::Sagas>>) -> Api {
        self.sagas = sagas;
        self
    }

    /// Ends open watches once `stopping` is set (the server's shutdown).
    pub fn with_stopping(mut self, stopping: Arc<AtomicBool>) -> Api {
        self.stopping = stopping;
        self
    }

    /// Wakes the reconciler after every accepted write, so it acts at once instead of at its
    /// next resync.
    pub fn with_wake(mut self, wake: Option<vmplane_hypervisor::WakeHandle>) -> Api {
        self.wake = wake;
        self
    }

    fn wrote(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
        if let Some(s) = &self.sagas {
            s.poke();
        }
    }

    /// The caller, from its bearer token.
    fn principal(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        crate::auth::principal_of(self.auth.as_deref(), metadata)
    }
}

/// The object a request names (its `ref`), once the caller may `access` it.
struct Target {
    kind: Kind,
    /// The request's namespace, or `default`.
    namespace: String,
    name: String,
    /// `KIND NAMESPACE/NAME` (`KIND NAME` when cluster-wide), for messages.
    object: String,
}

/// Reads a request's `ref` into a [`Target`]: its kind parsed, its namespace defaulted, and
/// `access` to it checked (and recorded on the request's span) — the same steps, in the same
/// order, for every request that names one object.
fn target(p: &Principal, access: Access, rf: Option<pb::ObjectRef>) -> Result<Target, Status> {
    let rf = rf.ok_or_else(|| {
        Status::invalid_argument("ref: is required: the kind, namespace and name of the object")
    })?;
    let kind = parse_kind("ref.kind", &rf.kind)?;
    let namespace = if kind.cluster_wide() {
        namespace_or_default(&rf.namespace)
    } else {
        namespace_in("ref.namespace", &rf.namespace)?
    };
    check_name("ref.name", &rf.name)?;
    let object = authorize(p, access, kind, &namespace, &rf.name)?;
    Ok(Target {
        kind,
        namespace,
        name: rf.name,
        object,
    })
}

/// Checks `access` to the object `kind` `namespace/name` and records it on the request's
/// span; returns how messages name it ([`describe`]). Kinds decided for the whole cluster
/// ([`Kind::cluster_wide`]: the cluster-scoped kinds and the cluster config, KubeVirt) ignore
/// the namespace, whatever the request or the manifest names: every authenticated principal
/// reads them, only an admin changes them.
fn authorize(
    p: &Principal,
    access: Access,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<String, Status> {
    let object = describe(kind, namespace, name);
    record_object(&object);
    check_access(p, access, kind, namespace)?;
    Ok(object)
}

/// [`authorize`] for every `kind` object of `namespace` (a list).
fn authorize_list(
    p: &Principal,
    access: Access,
    kind: Kind,
    namespace: &str,
) -> Result<(), Status> {
    let ns = (!kind.cluster_wide()).then_some(namespace);
    record_object(&format!("{} {}", kind.as_str(), ns.unwrap_or("-")));
    check_access(p, access, kind, namespace)
}

/// Whether `p` may `access` `kind` objects of `namespace` (any namespace for a cluster-wide
/// kind).
fn check_access(p: &Principal, access: Access, kind: Kind, namespace: &str) -> Result<(), Status> {
    let ns = (!kind.cluster_wide()).then_some(namespace);
    if p.may(access, ns) {
        return Ok(());
    }
    Err(denied(p, access, &format!("{} objects", kind.as_str()), ns))
}

/// Records the object a request is about on its tracing span (`grpc{… object=…}`).
fn record_object(object: &str) {
    tracing::Span::current().record("object", tracing::field::display(object));
}

/// PermissionDenied for `p` doing `access` to `what` objects of `namespace` (`None`: the
/// cluster scope), saying what to do next. Built from the request alone, never from what
/// exists, so it reveals nothing of the object.
pub(crate) fn denied(p: &Principal, access: Access, what: &str, namespace: Option<&str>) -> Status {
    let verb = match access {
        Access::Read => "read",
        Access::Write => "change",
        Access::Admin => "administer",
    };
    let (scope, next) = match (access, namespace) {
        (Access::Read, Some(ns)) => (
            format!("in namespace {ns}"),
            format!("ask an admin for the view or edit role in namespace {ns}"),
        ),
        (Access::Write, Some(ns)) => (
            format!("in namespace {ns}"),
            format!("ask an admin for the edit role in namespace {ns}"),
        ),
        (_, Some(ns)) => (
            format!("in namespace {ns}"),
            "use a token with the admin role".to_string(),
        ),
        (_, None) => (
            "(cluster-wide)".to_string(),
            "only the admin role may: use a token with the admin role".to_string(),
        ),
    };
    Status::permission_denied(format!(
        "principal {} may not {verb} {what} {scope}: {next}",
        p.name
    ))
}

/// Whether `p` may be told of an object in `namespace` (`None`: a stream naming none, told to
/// an admin only): what a rejection naming a holder is worded for.
fn may_name(p: &Principal, namespace: Option<&str>) -> bool {
    p.is_admin() || namespace.is_some_and(|ns| p.may(Access::Read, Some(ns)))
}

/// The kind a request's `field` names.
fn parse_kind(field: &str, kind: &str) -> Result<Kind, Status> {
    const KNOWN: &str = "use vm, vmi, instancetype, clusterinstancetype, preference, \
                         clusterpreference, snapshot, restore, clone or kubevirt";
    if kind.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field}: is required; {KNOWN}"
        )));
    }
    Kind::from_cli_name(kind).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{field}: kind {} is not known; {KNOWN}",
            vmplane_core::validate::shown(kind)
        ))
    })
}

/// Refuses a request's `field` that cannot name an object: it would only ever be not found.
fn check_name(field: &str, name: &str) -> Result<(), Status> {
    match vmplane_core::validate::name_problem(name) {
        None => Ok(()),
        Some(why) if name.is_empty() => Err(Status::invalid_argument(format!("{field}: {why}"))),
        Some(why) => Err(Status::invalid_argument(format!(
            "{field}: {}: {why}",
            vmplane_core::validate::shown(name)
        ))),
    }
}

/// A request's namespace `field` (`default` when empty), refused if it cannot be a
/// namespace: a read of one would only ever find nothing.
fn namespace_in(field: &str, namespace: &str) -> Result<String, Status> {
    if namespace.is_empty() {
        return Ok("default".to_string());
    }
    match vmplane_core::validate::namespace_problem(namespace) {
        None => Ok(namespace.to_string()),
        Some(why) => Err(Status::invalid_argument(format!(
            "{field}: {}: {why}",
            vmplane_core::validate::shown(namespace)
        ))),
    }
}

fn namespace_or_default(ns: &str) -> String {
    if ns.is_empty() {
        "default".to_string()
    } else {
        ns.to_string()
    }
}

/// Runs blocking storage/projection work off the runtime's workers, on tokio's blocking
/// threads, each under `SCHED_BATCH` from its first such task on (`vmplane_store::threads`):
/// woken for a task, it waits for the worker's time slice to end instead of preempting the
/// worker that handed it over. On 2 processors at 64 clients, 8 alternated pairs each: dry-run
/// creates 1.31× the rate, p99 0.74×; `Get`s 1.30×, p99 0.72× (PERFORMANCE.md, round
/// "sixteenth"). A refusal (see `threads::run_this_thread_under`) is not asked again.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, Status> + Send + 'static,
) -> Result<R, Status> {
    tokio::task::spawn_blocking(|| {
        keep_this_thread_under(Policy::Batch);
        f()
    })
    .await
    .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

fn from_projection(context: &str, err: vmplane_projections::Error) -> Status {
    use vmplane_projections::Error as E;
    match &err {
        // `what` names the object already (`VirtualMachine ns/x revision 7 not found`).
        E::NotFound { what } if what == context || what.starts_with(&format!("{context} ")) => {
            Status::not_found(err.to_string())
        }
        E::NotFound { .. } => Status::not_found(format!("{context}: {err}")),
        E::RevisionNotFound { .. } => status::with_reason(
            Status::not_found(format!("{context}: {err}")),
            status::REVISION_NOT_FOUND,
        ),
        E::Timeout { .. } => Status::deadline_exceeded(format!("{context}: {err}")),
        E::Invalid { .. } => Status::invalid_argument(format!("{context}: {err}")),
        E::Store(e) => status::from_store(context, e),
        _ => Status::internal(format!("{context}: {err}")),
    }
}

/// A command's error as `p` is told it: a rejection names an object in another namespace
/// (the holder of a firmware UUID) only when `p` may read that namespace.
fn from_command(p: &Principal, object: &str, err: CommandError) -> Status {
    match err {
        CommandError::Rejected(r) => status::from_rejection_for(object, &r, |ns| may_name(p, ns)),
        CommandError::Store(e) => status::from_store(object, &e),
        CommandError::Read(e) => from_projection(object, e),
        CommandError::RetriesExhausted { .. } => Status::aborted(format!("{object}: {err}")),
        other => Status::internal(format!("{object}: {other}")),
    }
}

fn describe(kind: Kind, namespace: &str, name: &str) -> String {
    if !kind.cluster_wide() {
        format!("{} {namespace}/{name}", kind.as_str())
    } else {
        format!("{} {name}", kind.as_str())
    }
}

/// The preconditions an applied manifest's own `metadata.uid` and `metadata.resourceVersion`
/// ask ([`Preconditions`]: checked on an update, ignored by a create; the resourceVersion
/// gives way to the request's `expected_resource_version` when it has one). Not taken from an
/// import (the uid and resourceVersion another cluster gave), nor for a snapshot, restore or
/// clone (an apply drives their saga).
fn manifest_preconditions(
    metadata: &vmplane_core::types::ObjectMeta,
    object: &str,
) -> Result<Preconditions, Status> {
    let uid = match metadata.uid.as_deref() {
        None | Some("") => None,
        Some(text) => Some(uuid::Uuid::parse_str(text).map_err(|_| {
            Status::invalid_argument(format!(
                "{object}: metadata.uid: {} is not a uid this server gave (remove it to apply \
                 whatever object has the name)",
                vmplane_core::validate::shown(text)
            ))
        })?),
    };
    let position = match metadata.resource_version.as_deref() {
        None | Some("") => None,
        Some(text) => Some(Position(text.parse::<u64>().map_err(|_| {
            Status::invalid_argument(format!(
                "{object}: metadata.resourceVersion: {} is not a resourceVersion this server \
                 gave (a log position; remove it to apply whatever the object's version)",
                vmplane_core::validate::shown(text)
            ))
        })?)),
    };
    Ok(Preconditions { uid, position })
}

/// How a manifest that does not parse is named in its error: `KIND NAMESPACE/NAME` when its
/// JSON says (the CLI sends JSON), `manifest` otherwise. Only JSON is read here: its parser has
/// a depth limit and no aliases, and the text is already within the request size limit.
fn manifest_context(text: &str, namespace: &str) -> String {
    // Named even when over the manifest limit: the request limit bounds what is parsed here.
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|doc| manifest_name(&doc, namespace))
        .unwrap_or_else(|| "manifest".to_string())
}

/// `KIND NAMESPACE/NAME` (`KIND NAME` when cluster-scoped) of a manifest's document, its
/// namespace defaulting to `namespace`; `None` without a kind and a name.
pub fn manifest_name(doc: &serde_json::Value, namespace: &str) -> Option<String> {
    let field = |path: &str| doc.pointer(path).and_then(|v| v.as_str()).unwrap_or("");
    let (kind, name) = (field("/kind"), field("/metadata/name"));
    if kind.is_empty() || name.is_empty() {
        return None;
    }
    let namespace = match field("/metadata/namespace") {
        "" => namespace_or_default(namespace),
        ns => ns.to_string(),
    };
    Some(match Kind::from_cli_name(kind) {
        Some(kind) => describe(kind, &namespace, name),
        None => format!("{kind} {name}"),
    })
}

fn to_pb(view: ObjectJson) -> pb::Object {
    pb::Object {
        kind: view.kind.as_str().to_string(),
        namespace: view.namespace.unwrap_or_default(),
        name: view.name,
        uid: view.uid.unwrap_or_default(),
        generation: view.generation,
        resource_version: view.resource_version.0,
        json: view.object,
    }
}

/// A list's continue token: the position every page is read at and the (namespace, name) the
/// next page starts after, as `1.<position>.<hex namespace>.<hex name>` (opaque to clients).
fn continue_token(at: Position, namespace: &str, name: &str) -> String {
    format!(
        "1.{}.{}.{}",
        at.0,
        hex::encode(namespace),
        hex::encode(name)
    )
}

fn parse_continue(token: &str) -> Result<(Position, (String, String)), Status> {
    let bad = || {
        Status::invalid_argument(format!(
            "continue_token: {} is not a token this server gave",
            vmplane_core::validate::shown(token)
        ))
    };
    let mut parts = token.split('.');
    let (Some("1"), Some(at), Some(ns), Some(name), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(bad());
    };
    let at = at.parse::<u64>().map_err(|_| bad())?;
    let text = |h: &str| {
        hex::decode(h)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(bad)
    };
    Ok((Position(at), (text(ns)?, text(name)?)))
}

fn parse_time(field: &str, value: &str) -> Result<Timestamp, Status> {
    let t = chrono::DateTime::parse_from_rfc3339(value).map_err(|e| {
        Status::invalid_argument(format!(
            "{field}: {} is not an RFC 3339 time: {e}",
            vmplane_core::validate::shown(value)
        ))
    })?;
    let ns = t
        .timestamp_nanos_opt()
        .ok_or_else(|| Status::invalid_argument(format!("{field}: {value:?} is out of range")))?;
    Ok(Timestamp(ns))
}

/// A client's `request_id` and the id its request is known by on the command path.
///
/// The command path answers every later request with a request id (of the same principal, on
/// the same object) with that id's first answer. A retry is the same request again; but a
/// client that reuses an id for another request (a delete after an apply, another manifest)
/// must not be told "done" for what was never done. So the id a request is known by is derived
/// from the client's and from what the request asks (the method and its arguments): the same
/// request again finds its first answer, another request with the same id is a new one. The
/// client's own id stays the correlation id of the events.
#[derive(Clone, Copy)]
struct RequestIds {
    client: uuid::Uuid,
    request: uuid::Uuid,
}

/// [`RequestIds`] of a request with client id `id` (none if empty) asking `what`.
fn request_ids(id: &str, what: &[&[u8]]) -> Result<Option<RequestIds>, Status> {
    if id.is_empty() {
        return Ok(None);
    }
    let client = uuid::Uuid::parse_str(id)
        .map_err(|_| Status::invalid_argument(format!("request_id: {id:?} is not a UUID")))?;
    let mut asked = Vec::with_capacity(what.iter().map(|w| w.len() + 8).sum());
    for part in what {
        // Each part after its length: no two requests' parts run together the same way.
        asked.extend_from_slice(&(part.len() as u64).to_be_bytes());
        asked.extend_from_slice(part);
    }
    Ok(Some(RequestIds {
        client,
        request: uuid::Uuid::new_v5(&client, &asked),
    }))
}

fn meta(p: &Principal, ids: Option<RequestIds>) -> CommandMeta {
    CommandMeta {
        actor: p.name.clone(),
        request_id: ids.map(|i| i.request),
        correlation_id: ids.map(|i| i.client),
        ..CommandMeta::default()
    }
}

/// An optional number as a part of what a request asks, for [`request_ids`].
fn optional(n: Option<u64>) -> [u8; 9] {
    let mut out = [0u8; 9];
    if let Some(n) = n {
        out[0] = 1;
        out[1..].copy_from_slice(&n.to_be_bytes());
    }
    out
}

/// The command `apply` runs for `manifest`, with the request's options.
fn apply_command(manifest: Manifest, expected: Option<u64>, import: bool) -> Command {
    let mut command = Command::apply(manifest);
    match &mut command {
        Command::Vm {
            command: VmCommand::Apply(put),
            ..
        } => {
            put.expected_generation = expected;
            if import {
                put.origin = vmplane_core::event::CreateOrigin::Import;
            }
        }
        Command::Object {
            command: ObjectCommand::Apply(_, gen_),
            ..
        } => *gen_ = expected,
        _ => {}
    }
    command
}

/// Where an applied object is: the object it names and the write that left it.
struct Written<'a> {
    object: &'a str,
    kind: Kind,
    namespace: &'a str,
    name: &'a str,
    done: &'a Executed,
    view: View,
}

impl<'a> Written<'a> {
    fn new(
        object: &'a str,
        kind: Kind,
        namespace: &'a str,
        name: &'a str,
        done: &'a Executed,
        view: View,
    ) -> Written<'a> {
        Written {
            object,
            kind,
            namespace,
            name,
            done,
            view,
        }
    }

    /// The answer from memory alone, when the state the write left is at hand: with the
    /// basic view, a VM's fields from its state with nothing rendered; else the rendered
    /// object. `None`: [`Written::answer`] must be taken (it may read the log).
    fn answer_in_memory(
        &self,
        projections: &Projections,
        after: &Snapshot,
    ) -> Option<Result<Response<pb::ApplyResponse>, Status>> {
        if self.view == View::Basic
            && let Some(header) = render::header(after, self.kind)
        {
            return Some(self.respond(Some(header.with_object(String::new()))));
        }
        let rendered = projections.render_written_in_memory(after, self.kind)?;
        Some(self.respond(rendered))
    }

    /// The answer: the object as the write left it, at the write's own position, not whatever a
    /// concurrent later write made of it since (a client uses the reply's generation as its
    /// next expected generation). From the state the write left when the command path kept
    /// it, else read there (which may read the log: a blocking thread's work).
    fn answer(
        &self,
        projections: &Projections,
        after: Option<&Arc<Snapshot>>,
    ) -> Result<Response<pb::ApplyResponse>, Status> {
        let view = match after {
            Some(after) => projections.render_written(after, self.kind, self.namespace, self.name),
            None => projections
                .get_at(
                    self.kind,
                    self.namespace,
                    self.name,
                    At::Position(self.done.position),
                )
                .map(|view| view.map(ObjectView::into_json)),
        }
        .map_err(|e| from_projection(self.object, e))?;
        self.respond(view)
    }

    /// The answer with `view` as the written object.
    fn respond(&self, view: Option<ObjectJson>) -> Result<Response<pb::ApplyResponse>, Status> {
        let object = self.object;
        let view =
            view.ok_or_else(|| Status::internal(format!("{object}: written but not readable")))?;
        Ok(Response::new(pb::ApplyResponse {
            object: Some(self.view.shape(to_pb(view))),
            outcome: self.done.outcome.as_str().to_string(),
            position: self.done.position.0,
            warnings: Vec::new(),
        }))
    }
}

/// How much of the written object an apply's answer carries (`ApplyRequest.view`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// The whole object (the default).
    Full,
    /// Everything but the object's text.
    Basic,
}

impl View {
    /// The view a request asks for; an unknown value is refused, naming the field.
    fn of(value: i32) -> Result<View, Status> {
        match pb::ObjectView::try_from(value) {
            Ok(pb::ObjectView::Unspecified | pb::ObjectView::Full) => Ok(View::Full),
            Ok(pb::ObjectView::Basic) => Ok(View::Basic),
            Err(_) => Err(Status::invalid_argument(format!(
                "view: {value} is not an ObjectView (0 unspecified, 1 full, 2 basic)"
            ))),
        }
    }

    /// `object` as this view carries it.
    fn shape(self, mut object: pb::Object) -> pb::Object {
        if self == View::Basic {
            object.json = String::new();
        }
        object
    }
}

/// Admission warnings of an accepted `Objects/Apply`, in the order KubeVirt's API server gives
/// them: a deprecated API version's ([`vmplane_core::schema::deprecated_api_version`]: `kubevirt.io/v1alpha3
/// is now deprecated and will be removed in a future release.`), one per field KubeVirt's API
/// does not know, in the API server's words (`unknown field
/// "spec.template.spec.domain.memory.gest"`, [`vmplane_core::schema::unknown_fields`]: the
/// object is still stored as written, as the API server does with field validation `Warn`),
/// then a KubeVirt CR's feature gates that are listed to no effect
/// ([`vmplane_core::features::config_warnings`]). A JSON text of another kind is checked in
/// one pass over its text ([`vmplane_core::schema::warnings_of_json`]); any other manifest is
/// parsed, here, into a JSON tree with core's limits. One that does not parse as one document
/// gets no warnings (the apply refuses it).
fn apply_warnings(manifest: &str) -> Vec<String> {
    // A JSON text of a VM (what gRPC clients and the load generator send) is checked in one
    // pass over its text: no JSON tree is built on the create path.
    if !manifest.contains("KubeVirt")
        && let Some(warnings) = vmplane_core::schema::warnings_of_json(manifest)
    {
        return warnings;
    }
    let Ok(mut documents) = vmplane_core::types::parse_documents(manifest.as_bytes()) else {
        return Vec::new();
    };
    let Some(document) = documents.pop().filter(|_| documents.is_empty()) else {
        return Vec::new();
    };
    let mut warnings = vmplane_core::schema::warnings(&document);
    if document.get("kind").and_then(serde_json::Value::as_str) == Some(Kind::KubeVirt.as_str())
        && let Ok(Manifest::Object(Kind::KubeVirt, o)) = Manifest::from_value(document)
    {
        warnings.extend(
            vmplane_core::features::config_warnings(&o)
                .iter()
                .map(ToString::to_string),
        );
    }
    warnings
}

impl Api {
    /// `Objects/Apply` but for its warnings ([`apply_warnings`]).
    async fn apply_unwarned(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::ApplyResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let view = View::of(r.view)?;
        let ids = request_ids(
            &r.request_id,
            &[
                b"apply",
                r.manifest.as_bytes(),
                r.namespace.as_bytes(),
                &optional(r.expected_generation),
                &optional(r.expected_resource_version),
                &[u8::from(r.import)],
            ],
        )?;
        let mut manifest = parse_manifest(r.manifest.as_bytes()).map_err(|e| {
            status::from_rejection(
                &manifest_context(&r.manifest, &r.namespace),
                &Rejection::from(e),
            )
        })?;
        let kind = manifest.kind();
        if !kind.managed() {
            return Err(Status::invalid_argument(format!(
                "kind: {} is parsed but not managed by vmplane",
                kind.as_str()
            )));
        }
        let namespace = match manifest.metadata().namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_string(),
            _ => namespace_or_default(&r.namespace),
        };
        if kind.namespaced() {
            manifest.metadata_mut().namespace = Some(namespace.clone());
        }
        let name = manifest.metadata().name_str().to_string();
        let object = authorize(&p, Access::Write, kind, &namespace, &name)?;
        // Snapshots, restores and clones: `apply` starts (or continues) their saga.
        let saga = match &self.sagas {
            Some(sagas) if !r.dry_run && crate::sagas::is_saga_kind(kind) => {
                crate::sagas::generic(manifest.clone()).map(|m| (sagas.clone(), m))
            }
            _ => None,
        };
        let expected_position = r.expected_resource_version.map(Position);
        if expected_position.is_some() && crate::sagas::is_saga_kind(kind) {
            return Err(Status::invalid_argument(format!(
                "expected_resource_version: {object}: an apply of a {} drives its saga and \
                 cannot be conditional on a resourceVersion",
                kind.as_str()
            )));
        }
        let if_live = if r.import || crate::sagas::is_saga_kind(kind) {
            Preconditions::default()
        } else {
            let mut asked = manifest_preconditions(manifest.metadata(), &object)?;
            // The request's own condition, when it states one, is the one that counts.
            if expected_position.is_some() {
                asked.position = None;
            }
            asked
        };
        let command = apply_command(manifest, r.expected_generation, r.import);
        let meta = CommandMeta {
            expected_position,
            if_live,
            ..meta(&p, ids)
        };
        let (commands, projections) = (self.commands.clone(), self.projections.clone());
        // The command path on this thread when it needs no read of the log and the log takes
        // submitted appends (the append is awaited, no thread parked for it); the answer too
        // when rendering it needs no read. A stream whose state is not in memory has it read
        // on a blocking thread first, once, then goes the same way. Everything else on a
        // blocking thread.
        let mut command = Some(command);
        let mut loaded = false;
        while !r.dry_run && saga.is_none() {
            let taken = command
                .take()
                .ok_or_else(|| Status::internal("no command"))?;
            match commands.execute_async(&meta, taken).await {
                Ok(AsyncExecuted::Uncached(back)) if !loaded => {
                    loaded = true;
                    let (stream, kind) = (back.stream(), back.kind());
                    command = Some(back);
                    // A failed read is met again, and reported, on the blocking path.
                    if self.loads.load(stream, kind).await? {
                        continue;
                    }
                    break;
                }
                Ok(AsyncExecuted::Done(done, after)) => {
                    let written = Written::new(&object, kind, &namespace, &name, &done, view);
                    let in_memory = after
                        .as_ref()
                        .and_then(|after| written.answer_in_memory(&projections, after));
                    let response = match in_memory {
                        Some(response) => response,
                        None => {
                            let (object, namespace, name) =
                                (object.clone(), namespace.clone(), name.clone());
                            let projections = projections.clone();
                            blocking(move || {
                                let written =
                                    Written::new(&object, kind, &namespace, &name, &done, view);
                                written.answer(&projections, after.as_ref())
                            })
                            .await
                        }
                    };
                    if response.is_ok() {
                        self.wrote();
                    }
                    return response;
                }
                Ok(AsyncExecuted::Uncached(back) | AsyncExecuted::Blocking(back)) => {
                    command = Some(back);
                    break;
                }
                Err(e) => return Err(from_command(&p, &object, e)),
            }
        }
        let command = command.ok_or_else(|| Status::internal("no command"))?;
        let reader = p.clone();
        let response = blocking(move || {
            if r.dry_run {
                // The whole object as it would be stored (namespace, uid, generation, firmware
                // UUID and serial, status), as Kubernetes' server-side dry run answers, or in
                // the basic view its fields without the text; a standalone VMI or the cluster
                // config is rendered from the log, so for them the manifest as sent.
                let rendered = !matches!(kind, Kind::VirtualMachineInstance | Kind::KubeVirt);
                let (outcome, written) = if rendered {
                    let (outcome, after) = commands
                        .dry_run_with_state(command, expected_position, if_live)
                        .map_err(|e| from_command(&reader, &object, e))?;
                    // A VM's basic view from its state alone; anything else rendered, its text
                    // then left out by the view.
                    let header = match view {
                        View::Basic => render::header(&after, kind)
                            .map(|header| header.with_object(String::new())),
                        View::Full => None,
                    };
                    let written = match header {
                        Some(header) => Some(header),
                        None => projections
                            .render_written(&after, kind, &namespace, &name)
                            .map_err(|e| from_projection(&object, e))?,
                    };
                    (outcome, written)
                } else {
                    let outcome = commands
                        .dry_run_expecting(command, expected_position, if_live)
                        .map_err(|e| from_command(&reader, &object, e))?;
                    (outcome, None)
                };
                let shown = match written {
                    Some(written) => to_pb(written),
                    None => pb::Object {
                        kind: kind.as_str().to_string(),
                        namespace: if kind.namespaced() {
                            namespace
                        } else {
                            String::new()
                        },
                        name,
                        json: r.manifest,
                        ..Default::default()
                    },
                };
                return Ok(Response::new(pb::ApplyResponse {
                    object: Some(view.shape(shown)),
                    outcome: outcome.as_str().to_string(),
                    position: projections.position().0,
                    warnings: Vec::new(),
                }));
            }
            if let Some((sagas, m)) = saga {
                let driven = sagas
                    .start(&meta, kind, &namespace, m)
                    .map_err(|e| from_command(&reader, &object, e))?;
                let found = projections
                    .get(kind, &namespace, &name, Some(driven.position))
                    .map_err(|e| from_projection(&object, e))?
                    .ok_or_else(|| {
                        Status::internal(format!("{object}: written but not readable"))
                    })?;
                return Ok(Response::new(pb::ApplyResponse {
                    object: Some(view.shape(to_pb(found.into_json()))),
                    outcome: driven.first.outcome.as_str().to_string(),
                    position: driven.position.0,
                    warnings: Vec::new(),
                }));
            }
            let (done, after) = commands
                .execute_with_state(&meta, command)
                .map_err(|e| from_command(&reader, &object, e))?;
            let written = Written::new(&object, kind, &namespace, &name, &done, view);
            written.answer(&projections, after.as_ref())
        })
        .await;
        if response.is_ok() {
            self.wrote();
        }
        response
    }
}

#[tonic::async_trait]
impl pb::objects_server::Objects for Api {
    async fn apply(
        &self,
        request: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::ApplyResponse>, Status> {
        let warnings = apply_warnings(&request.get_ref().manifest);
        let mut response = self.apply_unwarned(request).await?;
        response.get_mut().warnings = warnings;
        Ok(response)
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let Target {
            kind,
            namespace,
            name,
            object,
        } = target(&p, Access::Read, r.r#ref)?;
        let at = match r.at.and_then(|a| a.at) {
            None => At::Current,
            Some(pb::point_in_time::At::Revision(n)) => At::Revision(n),
            Some(pb::point_in_time::At::Position(n)) => At::Position(Position(n)),
            Some(pb::point_in_time::At::AsOf(t)) => At::Time(parse_time("as_of", &t)?),
        };
        let projections = self.projections.clone();
        let min = (r.min_position > 0).then_some(Position(r.min_position));
        blocking(move || {
            refuse_voided(&projections, &object, at)?;
            // The object's JSON text straight from the projections (no JSON tree per read).
            let view = match at {
                At::Current => projections.get_json(kind, &namespace, &name, min),
                other => projections.get_at_json(kind, &namespace, &name, other),
            }
            .map_err(|e| from_projection(&object, e))?;
            let when = match at {
                At::Current => String::new(),
                At::Revision(n) => format!(" at revision {n}"),
                At::Position(p) => format!(" at position {}", p.0),
                At::Time(_) => " at that time".to_string(),
            };
            let view = view.ok_or_else(|| {
                let status = Status::not_found(format!("{object} not found{when}"));
                if matches!(at, At::Revision(_)) {
                    status::with_reason(status, status::REVISION_NOT_FOUND)
                } else {
                    status
                }
            })?;
            Ok(Response::new(pb::GetResponse {
                object: Some(to_pb(view)),
                // Never a position a point-in-time restore voided (a watch would refuse it).
                read_position: projections.read_position().0,
            }))
        })
        .await
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let kind = parse_kind("kind", &r.kind)?;
        let namespace = if kind.cluster_wide() || r.all_namespaces {
            namespace_or_default(&r.namespace)
        } else {
            namespace_in("namespace", &r.namespace)?
        };
        // All namespaces: an admin sees every one; others see the ones they may read. Kinds
        // decided for the whole cluster (the cluster config too) are listed whatever the
        // namespace, as they are read by name.
        let (scope, readable) = if kind.cluster_wide() {
            authorize_list(&p, Access::Read, kind, &namespace)?;
            (None, None)
        } else if r.all_namespaces {
            record_object(&format!("{} (all namespaces)", kind.as_str()));
            (None, p.readable_namespaces())
        } else {
            authorize_list(&p, Access::Read, kind, &namespace)?;
            (Some(namespace), None)
        };
        let projections = self.projections.clone();
        let min = (r.min_position > 0).then_some(Position(r.min_position));
        // A point in the past for the first page; a later page's token carries the first's.
        let past = match r.at.and_then(|a| a.at) {
            None => None,
            Some(pb::point_in_time::At::Revision(_)) => {
                return Err(Status::invalid_argument(
                    "at.revision: a list has no revision: list it at a position or an instant \
                     (at.position, at.as_of; `vmplane get vms --at-position P` or `--as-of T`)",
                ));
            }
            Some(pb::point_in_time::At::Position(p)) => Some(At::Position(Position(p))),
            Some(pb::point_in_time::At::AsOf(t)) => Some(At::Time(parse_time("as_of", &t)?)),
        };
        let (token_at, after) = match r.continue_token.as_str() {
            "" => (None, None),
            token => {
                let (at, after) = parse_continue(token)?;
                (Some(at), Some(after))
            }
        };
        let selector = match r.label_selector.trim() {
            "" => None,
            text => Some(
                LabelSelector::parse(text)
                    .map_err(|e| Status::invalid_argument(format!("label_selector: {e}")))?,
            ),
        };
        let log = Arc::clone(&self.log);
        let limit = (r.limit > 0).then_some(r.limit as usize);
        let listed = format!("list of {}", kind.as_str());
        blocking(move || {
            let at = match (token_at, past) {
                (Some(at), _) => {
                    if let Err(head) = head_reaches(log.as_ref(), at.0, WATCH_AHEAD_WAIT) {
                        return Err(Status::invalid_argument(format!(
                            "continue_token: its position {} is past the log's head {}: not a \
                             token this server gave; list again without it",
                            at.0, head
                        )));
                    }
                    // This server never gives a token at a voided position: one is the
                    // original server's, read in a history this one does not have.
                    refuse_voided_as(
                        &projections,
                        "continue_token: position",
                        "continue_token",
                        At::Position(at),
                    )?;
                    Some(at)
                }
                (None, None) => None,
                (None, Some(At::Position(p))) => {
                    let head = log.head();
                    if p > head {
                        return Err(Status::invalid_argument(format!(
                            "at.position: position {} is past the log's head {}",
                            p.0, head.0
                        )));
                    }
                    refuse_voided(&projections, &listed, At::Position(p))?;
                    Some(p)
                }
                (None, Some(At::Time(t))) => {
                    refuse_voided(&projections, &listed, At::Time(t))?;
                    Some(
                        log.position_at(t)
                            .map_err(|e| status::from_store("as_of", &e))?,
                    )
                }
                (None, Some(_)) => None,
            };
            let page = vmplane_projections::ListPage {
                // The projections must have applied the point read at.
                min_position: min.max(at),
                at,
                after,
                limit,
                namespaces: readable,
                selector,
            };
            // One object at a time: each is held as a tree only while it is turned into text,
            // so a list of many objects costs their text, not their trees (~10x larger).
            let mut items = Vec::new();
            let mut bytes = 0usize;
            let end = projections
                .visit_page(kind, scope.as_deref(), &page, |v| {
                    let item = to_pb(v.into_json());
                    bytes += prost::Message::encoded_len(&item) + 8;
                    items.push(item);
                })
                .map_err(|e| from_projection(kind.as_str(), e))?;
            if bytes > RESPONSE_BYTES_MAX - 64 * 1024 {
                return Err(Status::resource_exhausted(format!(
                    "limit: {} objects are {:.1} MiB, over the {} MiB a response may hold: \
                     list in pages (limit, continue_token; `vmplane get --chunk-size N`)",
                    items.len(),
                    bytes as f64 / f64::from(1u32 << 20),
                    RESPONSE_BYTES_MAX >> 20
                )));
            }
            Ok(Response::new(pb::ListResponse {
                items,
                read_position: end.position.0,
                continue_token: end
                    .next
                    .map(|(ns, name)| continue_token(end.position, &ns, &name))
                    .unwrap_or_default(),
            }))
        })
        .await
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let ids = request_ids(
            &r.request_id,
            &[b"delete", &optional(r.expected_generation)],
        )?;
        let Target {
            kind,
            namespace,
            name,
            object,
        } = target(&p, Access::Write, r.r#ref)?;
        let command = match kind {
            Kind::VirtualMachine => Command::Vm {
                namespace,
                name,
                command: VmCommand::Delete {
                    expected_generation: r.expected_generation,
                },
            },
            Kind::VirtualMachineInstance => Command::Vmi {
                namespace,
                name,
                command: VmiCommand::Delete,
            },
            kind => Command::Object {
                kind,
                namespace,
                name,
                command: ObjectCommand::Delete(r.expected_generation),
            },
        };
        let meta = meta(&p, ids);
        let commands = self.commands.clone();
        let reader = p.clone();
        let response = blocking(move || {
            let done = commands
                .execute(&meta, command)
                .map_err(|e| from_command(&reader, &object, e))?;
            Ok(Response::new(pb::DeleteResponse {
                position: done.position.0,
            }))
        })
        .await;
        if response.is_ok() {
            self.wrote();
        }
        response
    }

    async fn expand(
        &self,
        request: Request<pb::ExpandRequest>,
    ) -> Result<Response<pb::ExpandResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let commands = self.commands.clone();
        match r.source {
            Some(pb::expand_request::Source::Ref(rf)) => {
                let kind = parse_kind("ref.kind", &rf.kind)?;
                if kind != Kind::VirtualMachine {
                    return Err(Status::invalid_argument(format!(
                        "expand: only VirtualMachines expand, not {}",
                        kind.as_str()
                    )));
                }
                let namespace = namespace_in("ref.namespace", &rf.namespace)?;
                check_name("ref.name", &rf.name)?;
                let object = authorize(&p, Access::Read, kind, &namespace, &rf.name)?;
                let reader = p.clone();
                blocking(move || {
                    let vm = commands
                        .expand_vm(&namespace, &rf.name)
                        .map_err(|e| from_command(&reader, &object, e))?
                        .ok_or_else(|| Status::not_found(format!("{object} not found")))?;
                    let json = serde_json::to_string(&vm)
                        .map_err(|e| Status::internal(format!("{object}: {e}")))?;
                    Ok(Response::new(pb::ExpandResponse { json }))
                })
                .await
            }
            Some(pb::expand_request::Source::Manifest(text)) => {
                let mut manifest = parse_manifest(text.as_bytes())
                    .map_err(|e| status::from_rejection("manifest", &Rejection::from(e)))?;
                if manifest.kind() != Kind::VirtualMachine {
                    return Err(Status::invalid_argument(format!(
                        "expand: only VirtualMachines expand, not {}",
                        manifest.kind().as_str()
                    )));
                }
                let namespace = match manifest.metadata().namespace.as_deref() {
                    Some(ns) if !ns.is_empty() => ns.to_string(),
                    _ => namespace_or_default(&r.namespace),
                };
                manifest.metadata_mut().namespace = Some(namespace.clone());
                let object = authorize(
                    &p,
                    Access::Read,
                    Kind::VirtualMachine,
                    &namespace,
                    manifest.metadata().name_str(),
                )?;
                let reader = p.clone();
                blocking(move || {
                    let vm = commands
                        .expand_manifest(manifest)
                        .map_err(|e| from_command(&reader, &object, e))?;
                    let json = serde_json::to_string(&vm)
                        .map_err(|e| Status::internal(format!("{object}: {e}")))?;
                    Ok(Response::new(pb::ExpandResponse { json }))
                })
                .await
            }
            None => Err(Status::invalid_argument(
                "expand: give a VM reference or a manifest",
            )),
        }
    }
}

#[tonic::async_trait]
impl pb::lifecycle_server::Lifecycle for Api {
    async fn start(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::LifecycleResponse>, Status> {
        self.lifecycle(request, VmCommand::Start { paused: false })
            .await
    }

    async fn stop(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::LifecycleResponse>, Status> {
        self.lifecycle(request, VmCommand::Stop).await
    }

    async fn restart(
        &self,
        request: Request<pb::LifecycleRequest>,
    ) -> Result<Response<pb::LifecycleResponse>, Status> {
        self.lifecycle(request, VmCommand::Restart).await
    }
}

impl Api {
    async fn lifecycle(
        &self,
        request: Request<pb::LifecycleRequest>,
        command: VmCommand,
    ) -> Result<Response<pb::LifecycleResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let namespace = namespace_in("namespace", &r.namespace)?;
        check_name("name", &r.name)?;
        let object = authorize(&p, Access::Write, Kind::VirtualMachine, &namespace, &r.name)?;
        let asked = format!("{command:?}");
        let meta = meta(
            &p,
            request_ids(&r.request_id, &[b"lifecycle", asked.as_bytes()])?,
        );
        let command = Command::Vm {
            namespace,
            name: r.name,
            command,
        };
        let commands = self.commands.clone();
        let reader = p.clone();
        let response = blocking(move || {
            let done = commands
                .execute(&meta, command)
                .map_err(|e| from_command(&reader, &object, e))?;
            Ok(Response::new(pb::LifecycleResponse {
                position: done.position.0,
                outcome: done.outcome.as_str().to_string(),
            }))
        })
        .await;
        if response.is_ok() {
            self.wrote();
        }
        response
    }
}

#[tonic::async_trait]
impl pb::history_server::History for Api {
    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let Target {
            kind,
            namespace,
            name,
            object,
        } = target(&p, Access::Read, r.r#ref)?;
        let projections = self.projections.clone();
        let (min, wait) = (r.min_position, self.read_wait);
        blocking(move || {
            if min > 0 {
                projections
                    .wait_for(Position(min), wait)
                    .map_err(|e| from_projection(&object, e))?;
            }
            let mut recorded_in = None;
            let entries = match projections.history(kind, &namespace, &name) {
                // A VM's VMI lives in the VM's stream: its rows are the VM's revisions that
                // hold the current VMI's events.
                Err(vmplane_projections::Error::NotFound { .. })
                    if kind == Kind::VirtualMachineInstance
                        && projections
                            .history(Kind::VirtualMachine, &namespace, &name)
                            .is_ok() =>
                {
                    let rows = projections.vm_vmi_history(&namespace, &name).map_err(
                        |e| match e {
                            vmplane_projections::Error::NotFound { .. } => {
                                Status::not_found(format!(
                                    "{object} not found: VM {namespace}/{name} runs no VMI now, \
                                     and a VM's VMIs are recorded in the VM's history \
                                     (ref.kind vm; `vmplane history vm {name} -n {namespace}`)"
                                ))
                            }
                            e => from_projection(&object, e),
                        },
                    )?;
                    recorded_in = Some(pb::ObjectRef {
                        kind: "vm".into(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                    });
                    rows
                }
                other => other.map_err(|e| from_projection(&object, e))?,
            };
            let older = match r.limit {
                0 => 0,
                limit => entries.len().saturating_sub(limit as usize),
            };
            let revisions: Vec<pb::Revision> = entries
                .into_iter()
                .skip(older)
                .map(|h| pb::Revision {
                    revision: h.revision,
                    first_revision: h.first_revision,
                    position: h.position,
                    generation: h.generation,
                    time: h.time,
                    actor: h.actor,
                    events: h.events,
                    summary: h.summary,
                })
                .collect();
            let response = pb::HistoryResponse {
                revisions,
                older: older as u64,
                recorded_in,
            };
            // Refused whole rather than cut by the transport: say how to ask for less.
            let bytes = prost::Message::encoded_len(&response);
            if bytes > RESPONSE_BYTES_MAX {
                return Err(Status::resource_exhausted(format!(
                    "{object}: its {} revisions are {bytes} bytes, more than the \
                     {RESPONSE_BYTES_MAX} a response may hold; ask for the newest with limit \
                     (`vmplane history --limit N`)",
                    response.revisions.len()
                )));
            }
            Ok(Response::new(response))
        })
        .await
    }

    async fn diff(
        &self,
        request: Request<pb::DiffRequest>,
    ) -> Result<Response<pb::DiffResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let Target {
            kind,
            namespace,
            name,
            object,
        } = target(&p, Access::Read, r.r#ref)?;
        let projections = self.projections.clone();
        blocking(move || {
            let d = projections
                .diff(kind, &namespace, &name, r.from_revision, r.to_revision)
                .map_err(|e| from_projection(&object, e))?;
            Ok(Response::new(pb::DiffResponse {
                equal: d.is_equal(),
                unified_diff: d.diff,
            }))
        })
        .await
    }

    async fn audit(
        &self,
        request: Request<pb::AuditRequest>,
    ) -> Result<Response<pb::AuditResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let kind = if r.kind.is_empty() {
            None
        } else {
            Some(parse_kind("kind", &r.kind)?)
        };
        let since = if r.since.is_empty() {
            None
        } else {
            Some(parse_time("since", &r.since)?)
        };
        // `until` is exclusive on the wire; the projection's bound is inclusive.
        let until = if r.until.is_empty() {
            None
        } else {
            let t = parse_time("until", &r.until)?;
            Some(Timestamp(t.0.saturating_sub(1)))
        };
        let limit = if r.limit == 0 {
            AUDIT_ENTRIES_MAX
        } else {
            (r.limit as usize).min(AUDIT_ENTRIES_MAX)
        };
        let (namespace, readable) = event_scope(
            &p,
            kind,
            r.all_namespaces,
            &r.namespace,
            ("audit", "the audit"),
        )?;
        let projections = self.projections.clone();
        blocking(move || {
            let query = vmplane_projections::history::AuditQuery {
                actor: (!r.actor.is_empty()).then_some(r.actor),
                namespace,
                readable,
                kind,
                since,
                until,
                records_max: limit,
            };
            // With one entry per point-in-time restore's cut (see `audit_with_voided` for who
            // sees it and why).
            let audit = projections
                .audit_with_voided(&query)
                .map_err(|e| from_projection("audit", e))?;
            let mut records = audit.records;
            for a in records
                .iter_mut()
                .filter(|a| a.kind == Kind::KubeVirt.as_str())
            {
                if let Some(name) = cluster_config_name(&projections, a.position)? {
                    a.name = name;
                }
            }
            let entries = records
                .into_iter()
                .map(|a| pb::AuditEntry {
                    position: a.position,
                    time: a.time,
                    actor: a.actor,
                    namespace: a.namespace,
                    kind: a.kind,
                    name: a.name,
                    event: a.event,
                    summary: a.summary,
                })
                .collect();
            Ok(Response::new(pb::AuditResponse {
                entries,
                older: audit.older,
            }))
        })
        .await
    }
}

/// The KubeVirt object's name at `position`, for audit and watch entries: its stream
/// (`cluster/config`) does not carry it. The entry stays in the cluster scope (no namespace),
/// as the cluster config is one object for the whole cluster whatever namespace its manifest
/// named, readable by every principal: an entry never shows a namespace its reader has no
/// role in.
fn cluster_config_name(projections: &Projections, position: u64) -> Result<Option<String>, Status> {
    projections
        .cluster_config_identity(Position(position))
        .map(|identity| identity.map(|(_, name)| name))
        .map_err(|e| from_projection("KubeVirt", e))
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

/// A watch resumes after `from`; refused (`INVALID_ARGUMENT`) when the log's head does not reach
/// `from` within [`WATCH_AHEAD_WAIT`], and (`FAILED_PRECONDITION`, Kubernetes' "410 Gone") when a
/// point-in-time restore voided that position: the client saw an event the restored history does
/// not have, so it must re-list (see [`crate::dr`], "Positions never go backwards"). This
/// server never hands out a voided position itself (a list reads at the last position before
/// them, [`Projections::live_position`]), so a voided one always comes from the original server.
/// The message names the restore, the cut and the range only, not what stood there (another
/// namespace's).
fn check_from_position(
    log: &dyn EventLog,
    projections: &Projections,
    from: u64,
) -> Result<(), Status> {
    if from == 0 {
        return Ok(());
    }
    refuse_position_past_head(log, from, WATCH_AHEAD_WAIT)?;
    refuse_voided_as(
        projections,
        "watch from position",
        "watch from",
        At::Position(Position(from)),
    )
}

/// Refuses a read at `at` (`FAILED_PRECONDITION`, as a watch from the position is refused, in the
/// same words) when a point-in-time restore voided that position, or rewrote that instant: from
/// when the original server recorded the first voided event up to the restore, the restored
/// log would answer with the state at the cut, which is not what was served then
/// ([`vmplane_projections::projections::VoidedRange::rewrote`]). `what` names what was asked
/// (an object, a list): the message names `WHAT: at.position P` or `WHAT: as of T`. Other points
/// pass.
fn refuse_voided(projections: &Projections, what: &str, at: At) -> Result<(), Status> {
    refuse_voided_as(
        projections,
        &format!("{what}: at.position"),
        &format!("{what}: as of"),
        at,
    )
}

/// [`refuse_voided`] with the field named as given: `position_field P`, `time_field T`.
fn refuse_voided_as(
    projections: &Projections,
    position_field: &str,
    time_field: &str,
    at: At,
) -> Result<(), Status> {
    let gone = match at {
        At::Position(p) => projections
            .voided_at(p)
            .map_err(|e| from_projection(position_field, e))?
            .map(|r| r.position_gone(position_field, p.0)),
        At::Time(t) => projections
            .rewritten_at(t)
            .map_err(|e| from_projection(time_field, e))?
            .map(|r| r.time_gone(time_field, &vmplane_projections::model::rfc3339_nanos(t.0))),
        At::Current | At::Revision(_) => None,
    };
    match gone {
        Some(message) => Err(Status::failed_precondition(message)),
        None => Ok(()),
    }
}

/// How long a watch from a position past the log's head waits for the head to reach it (a
/// position another server of the cluster gave, which this one has not read yet) before it is
/// refused: Kubernetes' watch cache waits as long for a resourceVersion it has not seen.
const WATCH_AHEAD_WAIT: Duration = Duration::from_secs(3);

/// Refuses a watch from a position the log's head has not reached within `wait`: it would
/// otherwise wait, silently, for events that may never come (a mistyped position, or one from
/// another data directory).
fn refuse_position_past_head(log: &dyn EventLog, from: u64, wait: Duration) -> Result<(), Status> {
    head_reaches(log, from, wait).map_err(|head| {
        Status::invalid_argument(format!(
            "from_position: position {from} is past the log's head {head}; watch without \
             --from-position to start at the head, or from a list's resourceVersion"
        ))
    })
}

/// Waits up to `wait` for the log's head to reach `position`: the head it stayed at if it
/// did not (a position another server of the cluster gave may be a little ahead of this
/// one; a made-up one never comes).
fn head_reaches(log: &dyn EventLog, position: u64, wait: Duration) -> Result<(), u64> {
    let head = log
        .wait_for(Position(position), wait)
        .unwrap_or_else(|_| log.head());
    if position <= head.0 {
        Ok(())
    } else {
        Err(head.0)
    }
}

/// What a watch stream's task needs besides its [`Watch`] and its channel.
struct Delivery {
    log: Arc<dyn EventLog>,
    projections: Arc<Projections>,
    /// The namespaces its principal may read, for a watch of all namespaces (`None`: all).
    readable: Option<Arc<[String]>>,
    heads: tokio::sync::watch::Receiver<u64>,
    stopping: Arc<AtomicBool>,
}

/// How long an idle watch sleeps at most before it looks again at the server's shutdown flag
/// and its client (a head it missed is found then too).
const WATCH_IDLE_TICK: Duration = Duration::from_millis(500);

/// Delivers `watch`'s events to `tx` until the client goes away, the server stops or a read
/// fails. An idle watch is an async task awaiting the log's head ([`head_signal`]) and a slow
/// client's watch awaits room in its channel: neither holds a thread. Only reading a batch of
/// events runs on a blocking thread, for as long as that read takes; a watch that held one for
/// its whole life let ~512 idle watches of any reader take tokio's whole blocking pool, and
/// every read of every client with it.
async fn deliver(
    mut watch: vmplane_projections::watch::Watch,
    tx: tokio::sync::mpsc::Sender<Result<pb::WatchEvent, Status>>,
    mut d: Delivery,
) {
    // What the watch is told to resume from if it ends before delivering anything: never a
    // voided position (a watch from one is refused).
    let mut delivered = d.projections.live_position(watch.position()).0;
    loop {
        if d.stopping.load(Ordering::Acquire) {
            let _ = tx
                .send(Err(Status::unavailable(format!(
                    "the server is shutting down: watch again with --from-position {delivered} \
                     (from_position) to continue without a gap"
                ))))
                .await;
            return;
        }
        if d.log.head() <= watch.position() {
            // Nothing new yet: wait for the head to move, the client to leave, or a tick.
            let head_moved = async {
                if d.heads.changed().await.is_err() {
                    // No signal (its thread is gone): the tick alone wakes this watch.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = head_moved => {}
                () = tx.closed() => return,
                () = tokio::time::sleep(WATCH_IDLE_TICK) => {}
            }
            continue;
        }
        let projections = Arc::clone(&d.projections);
        let readable = d.readable.clone();
        let read = tokio::task::spawn_blocking(move || {
            keep_this_thread_under(Policy::Batch);
            let batch = next_watch_events(&mut watch, &projections, readable.as_deref());
            (watch, batch)
        })
        .await;
        let batch = match read {
            Ok((w, batch)) => {
                watch = w;
                batch
            }
            Err(e) => {
                let _ = tx
                    .send(Err(Status::internal(format!("watch: worker failed: {e}"))))
                    .await;
                return;
            }
        };
        let events = match batch {
            Ok(events) => events,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        for event in events {
            let position = event.position;
            if tx.send(Ok(event)).await.is_err() {
                return; // the client went away
            }
            delivered = position;
        }
    }
}

/// The namespaces a query of events (`audit`, `watch`) covers, as (namespace, readable): one
/// namespace, checked; or every namespace (`None`), of which a principal that is not an admin
/// sees the ones in `readable` and the cluster-scoped events. A cluster-scoped kind's events
/// are in no namespace, and every principal may read them: asked for by kind, they are found
/// whatever the namespace, as `list` finds the kind's objects. `what` is (the request, for the
/// trace; what a refusal says was refused).
fn event_scope(
    p: &Principal,
    kind: Option<Kind>,
    all_namespaces: bool,
    namespace: &str,
    what: (&str, &str),
) -> Result<(Option<String>, Option<Vec<String>>), Status> {
    if kind.is_some_and(Kind::cluster_wide) {
        return Ok((None, None));
    }
    if all_namespaces {
        return Ok((None, p.readable_namespaces()));
    }
    let ns = namespace_in("namespace", namespace)?;
    record_object(&format!("{} {ns}", what.0));
    if !p.may(Access::Read, Some(&ns)) {
        return Err(denied(p, Access::Read, what.1, Some(&ns)));
    }
    Ok((Some(ns), None))
}

/// The next events of `watch` already in the log (at most 256; none if all it read were
/// filtered out), as its principal may see them: an event of a namespace outside `readable`
/// is left out, and a KubeVirt entry is named.
fn next_watch_events(
    watch: &mut vmplane_projections::watch::Watch,
    projections: &Projections,
    readable: Option<&[String]>,
) -> Result<Vec<pb::WatchEvent>, Status> {
    let batch = watch
        .next_batch(256, Duration::ZERO)
        .map_err(|e| status::from_store("watch", &e))?;
    let mut out = Vec::with_capacity(batch.len());
    for mut e in batch {
        if let Some(allowed) = readable
            && !e.namespace.is_empty()
            && !allowed.contains(&e.namespace)
        {
            continue;
        }
        if e.kind == Kind::KubeVirt.as_str()
            && let Some(name) = cluster_config_name(projections, e.position)?
        {
            e.name = name;
        }
        out.push(pb::WatchEvent {
            position: e.position,
            time: e.time,
            actor: e.actor,
            namespace: e.namespace,
            kind: e.kind,
            name: e.name,
            event: e.event,
        });
    }
    Ok(out)
}

/// The log's head as it moves, for watches to await without a thread each: one thread waits
/// on the log ([`EventLog::wait_for`]) and publishes every new head. While no watch is open
/// (the [`Api`]'s own receiver is the only one) it only looks every 50 ms whether one is, so
/// a server under writes and without watches is not woken for every commit. It ends once no
/// receiver is left (the [`Api`] and its watches are gone).
fn head_signal(log: Arc<dyn EventLog>) -> tokio::sync::watch::Receiver<u64> {
    let (tx, rx) = tokio::sync::watch::channel(log.head().0);
    let waiter = move || {
        let mut seen = log.head().0;
        while !tx.is_closed() {
            if tx.receiver_count() <= 1 {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            match log.wait_for(Position(seen + 1), WATCH_IDLE_TICK) {
                Ok(head) if head.0 != seen => {
                    seen = head.0;
                    tx.send_replace(seen);
                }
                Ok(_) => {}
                // A log that cannot say its head now: watches still wake on their tick.
                Err(_) => std::thread::sleep(WATCH_IDLE_TICK),
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("vmplane-head".into())
        .spawn(waiter)
    {
        tracing::warn!(error = %e, "no thread for the head signal: watches wake on their tick");
    }
    rx
}

#[tonic::async_trait]
impl pb::watch_server::Watch for Api {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let p = self.principal(request.metadata())?;
        let r = request.into_inner();
        let kind = if r.kind.is_empty() {
            None
        } else {
            Some(parse_kind("kind", &r.kind)?)
        };
        let (namespace, readable) = event_scope(
            &p,
            kind,
            r.all_namespaces,
            &r.namespace,
            ("watch", "the events"),
        )?;
        let after = match r.from_position {
            Some(p) => {
                let log = Arc::clone(&self.log);
                let projections = self.projections.clone();
                blocking(move || check_from_position(log.as_ref(), &projections, p)).await?;
                Position(p)
            }
            None => self.log.head(),
        };
        // The cuts of point-in-time restores this watch will cross: no event is delivered for
        // their positions (they hold no object's change), so the jump is said here, once.
        let crossing = {
            let projections = self.projections.clone();
            blocking(move || {
                projections
                    .voided_after(after)
                    .map_err(|e| from_projection("watch", e))
            })
            .await?
        };
        let watch = self
            .projections
            .watch(after, WatchFilter { kind, namespace });
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER_EVENTS_MAX);
        tokio::spawn(deliver(
            watch,
            tx,
            Delivery {
                log: Arc::clone(&self.log),
                projections: self.projections.clone(),
                readable: readable.map(Arc::from),
                heads: self.heads.clone(),
                stopping: Arc::clone(&self.stopping),
            },
        ));
        let mut response: Response<WatchStream> =
            Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)));
        if let Some(notice) = voided_notice(&crossing) {
            response
                .metadata_mut()
                .insert(VOIDED_POSITIONS_METADATA, notice);
        }
        Ok(response)
    }
}

/// The metadata of a watch's response naming the positions point-in-time restores voided that
/// the watch will pass: `F..=L (restore EPOCH cut at C)`, `; `-separated. A watch delivers no
/// event for them (see [`vmplane_projections::watch`]); this says why its positions jump there.
pub const VOIDED_POSITIONS_METADATA: &str = "vmplane-voided-positions";

/// [`VOIDED_POSITIONS_METADATA`]'s value for `ranges` (`None` for none).
fn voided_notice(
    ranges: &[vmplane_projections::projections::VoidedRange],
) -> Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> {
    if ranges.is_empty() {
        return None;
    }
    let text = ranges
        .iter()
        .map(|r| {
            format!(
                "{}..={} (restore {} cut at {})",
                r.first, r.last, r.epoch, r.cut
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // Digits, a UUID and ASCII words: always a valid value; were it not, no notice.
    text.parse().ok()
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for Api {
    async fn features(
        &self,
        request: Request<pb::FeaturesRequest>,
    ) -> Result<Response<pb::FeaturesResponse>, Status> {
        // The cluster configuration is readable by every authenticated principal; how many
        // VMs use a feature counts only the VMs the principal may read (as `features usage`
        // lists them), or the count would tell of namespaces it has no role in.
        let p = self.principal(request.metadata())?;
        let readable = p.readable_namespaces();
        let projections = self.projections.clone();
        blocking(move || {
            let features = projections
                .features_at(None)
                .map_err(|e| from_projection("features", e))?;
            let usage: std::collections::HashMap<String, usize> = match &readable {
                None => projections
                    .feature_usage()
                    .map_err(|e| from_projection("features", e))?
                    .into_iter()
                    .collect(),
                Some(allowed) => {
                    let mut usage = std::collections::HashMap::new();
                    for f in features.statuses() {
                        let users = projections
                            .vms_using_feature(f.name)
                            .map_err(|e| from_projection("features", e))?;
                        let count = users
                            .iter()
                            .filter(|r| r.namespace.as_ref().is_none_or(|ns| allowed.contains(ns)))
                            .count();
                        usage.insert(f.name.to_string(), count);
                    }
                    usage
                }
            };
            let features = features
                .statuses()
                .iter()
                .map(|f| pb::Feature {
                    name: f.name.to_string(),
                    enabled: f.enabled,
                    source: f.source.as_str().to_string(),
                    stage: f.stage.as_str().to_string(),
                    used_by: usage.get(f.name).copied().unwrap_or(0) as u64,
                })
                .collect();
            Ok(Response::new(pb::FeaturesResponse {
                features,
                read_position: projections.read_position().0,
            }))
        })
        .await
    }

    async fn feature_usage(
        &self,
        request: Request<pb::FeatureUsageRequest>,
    ) -> Result<Response<pb::FeatureUsageResponse>, Status> {
        let p = self.principal(request.metadata())?;
        let feature = request.into_inner().feature;
        let Some(gate) = vmplane_core::features::gate(&feature) else {
            return Err(Status::invalid_argument(format!(
                "feature {feature:?} is not a KubeVirt feature gate vmplane knows; see `vmplane features`"
            )));
        };
        let readable = p.readable_namespaces();
        let projections = self.projections.clone();
        blocking(move || {
            let enabled = projections
                .features_at(None)
                .map_err(|e| from_projection("features", e))?
                .is_enabled(gate.name);
            let users = projections
                .vms_using_feature(gate.name)
                .map_err(|e| from_projection("features", e))?
                .into_iter()
                .filter(|r| match (&readable, &r.namespace) {
                    (Some(allowed), Some(ns)) => allowed.contains(ns),
                    _ => true,
                })
                .map(|r| pb::FeatureUser {
                    kind: r.kind.as_str().to_string(),
                    namespace: r.namespace.unwrap_or_default(),
                    name: r.name,
                })
                .collect();
            Ok(Response::new(pb::FeatureUsageResponse {
                users,
                enabled,
                read_position: projections.read_position().0,
            }))
        })
        .await
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use vmplane_store::threads::{Policy, policy_of_this_thread};

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn blocking_work_runs_under_batch_and_the_worker_stays_as_it_was() {
        // Asked on the runtime's worker (a spawned task), not on the test's own thread.
        let on_the_worker = || async {
            tokio::spawn(async { policy_of_this_thread() })
                .await
                .expect("task")
        };
        let worker = on_the_worker().await;
        assert!(worker.is_some());
        for _ in 0..4 {
            let policy = super::blocking(|| Ok(policy_of_this_thread()))
                .await
                .expect("blocking task");
            assert_eq!(policy, Some(Policy::Batch.linux_number()));
            assert_eq!(on_the_worker().await, worker, "the worker's own policy");
        }
        assert_ne!(worker, Some(Policy::Batch.linux_number()));
    }
}
