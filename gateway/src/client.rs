//! The client commands: each turns its arguments into gRPC calls and prints the answer as a
//! table, YAML or JSON, like kubectl.

use std::io::{IsTerminal, Write};

use anyhow::{Context, anyhow, bail};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::cli::{
    ApplyArgs, AuditArgs, DeleteArgs, DescribeArgs, DiffArgs, ExpandArgs, GetArgs, GlobalArgs,
    HistoryArgs, LifecycleArgs, MetadataArgs, Output, PatchArgs, PatchType, WaitArgs, WatchArgs,
};
use crate::input::{self, Unit};
use crate::pb;
use crate::print;
use crate::tls::ClientChannel;
use vmplane_core::types::Kind;

/// Exit status of `diff` when the revisions differ.
pub const DIFF_DIFFERENT_EXIT: u8 = 1;

/// Adds the bearer token to every request.
#[derive(Clone)]
pub struct TokenInterceptor {
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

type Intercepted = tonic::service::interceptor::InterceptedService<ClientChannel, TokenInterceptor>;

/// Connected clients for every service.
pub struct Clients {
    pub objects: pb::objects_client::ObjectsClient<Intercepted>,
    pub lifecycle: pb::lifecycle_client::LifecycleClient<Intercepted>,
    pub history: pb::history_client::HistoryClient<Intercepted>,
    pub watch: pb::watch_client::WatchClient<Intercepted>,
    pub cluster: pb::cluster_client::ClusterClient<Intercepted>,
}

/// Largest message the client accepts from the server, in bytes.
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 64 << 20;

impl Clients {
    /// Connects to `--server`.
    pub async fn connect(global: &GlobalArgs) -> anyhow::Result<Clients> {
        let channel = connect_channel(global).await?;
        let token = match &global.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| anyhow!("--token: must be printable ASCII"))?,
            ),
            None => None,
        };
        let i = TokenInterceptor { token };
        Ok(Clients {
            objects: pb::objects_client::ObjectsClient::with_interceptor(
                channel.clone(),
                i.clone(),
            )
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
            lifecycle: pb::lifecycle_client::LifecycleClient::with_interceptor(
                channel.clone(),
                i.clone(),
            ),
            history: pb::history_client::HistoryClient::with_interceptor(
                channel.clone(),
                i.clone(),
            )
            .max_decoding_message_size(CLIENT_MESSAGE_BYTES_MAX),
            watch: pb::watch_client::WatchClient::with_interceptor(channel.clone(), i.clone()),
            cluster: pb::cluster_client::ClusterClient::with_interceptor(channel, i),
        })
    }
}

/// A channel to `--server`: TLS for `https://` (verified against `--ca-cert`, else the webpki
/// roots; never plaintext), plaintext for `http://`. A failure is one line naming what failed.
pub async fn connect_channel(global: &GlobalArgs) -> anyhow::Result<ClientChannel> {
    let ca_cert = global.ca_cert.as_deref();
    let endpoint = crate::tls::client_endpoint(&global.server, ca_cert)?;
    crate::tls::connect(endpoint, &global.server, ca_cert).await
}

/// A gRPC error as one line: the server's message already names the object and field; a
/// hint of what to do next ends it, in parentheses, when the server's message does not say.
pub fn status_error(status: Status) -> anyhow::Error {
    status_error_about(status, None)
}

/// [`status_error`] for a request about one object named on the command line: its hint can
/// name the command to run next (`vmplane get vms -n NS`, `vmplane history vm NAME`, ...).
pub fn status_error_about(status: Status, about: Option<&About<'_>>) -> anyhow::Error {
    let code = match status.code() {
        tonic::Code::InvalidArgument => "invalid",
        tonic::Code::NotFound => "not found",
        tonic::Code::AlreadyExists => "already exists",
        tonic::Code::Aborted => "conflict",
        tonic::Code::FailedPrecondition => "refused",
        tonic::Code::PermissionDenied => "permission denied",
        tonic::Code::Unauthenticated => "unauthenticated",
        // OutOfRange: tonic's answer to a request above the server's message size limit.
        tonic::Code::ResourceExhausted | tonic::Code::OutOfRange => "too large",
        tonic::Code::Unavailable => "server unavailable",
        tonic::Code::DeadlineExceeded => "timed out",
        _ => "server error",
    };
    let message = status.message();
    match hint(&status, about) {
        Some(todo) => anyhow!("{code}: {message} ({todo})"),
        None => anyhow!("{code}: {message}"),
    }
}

/// The object a request named on the command line, and how it asked for it: what the hint
/// at the end of its error line is about.
#[derive(Debug, Clone, Default)]
pub struct About<'a> {
    /// The kind as typed (`vm`, `snapshots`, `VirtualMachine`, ...).
    pub kind: &'a str,
    /// The namespace it was asked in (ignored for cluster-wide kinds).
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// `start`, `stop` or `restart`, for a lifecycle request.
    pub verb: Option<Verb>,
    /// `--at-position P` or `--as-of T`, when it was read as it was then.
    pub then: Option<String>,
    /// For a refused lifecycle request: the VM as read after the refusal, which decides what
    /// the hint may suggest (`None`: not read, and no lifecycle command is suggested).
    pub vm: Option<VmFacts>,
}

/// What decides which lifecycle request a VM accepts (core's `lifecycle` and the VM
/// aggregate's start, stop and restart rules): its run strategy, whether it has a VMI that has
/// not ended, and whether its last VMI failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmFacts {
    /// `status.runStrategy` (`None`: none valid).
    pub run_strategy: Option<vmplane_core::lifecycle::RunStrategy>,
    /// `status.created`: a VMI that has not ended.
    pub active: bool,
    /// Whether its VMI (ended) failed; `None` when that was not read.
    pub vmi_failed: Option<bool>,
}

impl VmFacts {
    /// Whether the VM accepts `verb` now, by the rules of `vmplane_core::aggregate::vm`'s
    /// `start`, `stop` and `restart`; `false` when that depends on what was not read.
    #[must_use]
    pub fn accepts(&self, verb: Verb) -> bool {
        use vmplane_core::lifecycle::RunStrategy as R;
        let Some(rs) = self.run_strategy else {
            return false;
        };
        match verb {
            Verb::Start => {
                !self.active
                    && match rs {
                        R::Always | R::Once => false,
                        R::Halted | R::Manual => true,
                        R::RerunOnFailure => self.vmi_failed == Some(false),
                    }
            }
            // Under Always and Once a stop is always taken (it halts the VM); otherwise a VMI
            // must be running.
            Verb::Stop => matches!(rs, R::Always | R::Once) || self.active,
            Verb::Restart => self.active && !matches!(rs, R::Halted | R::Once),
        }
    }
}

impl<'a> About<'a> {
    /// A request about `kind` `namespace/name`.
    #[must_use]
    pub fn object(kind: &'a str, namespace: &'a str, name: &'a str) -> About<'a> {
        About {
            kind,
            namespace,
            name,
            ..About::default()
        }
    }
}

/// How the CLI names a kind's objects: `get`'s singular and plural (kubectl's short forms) and
/// what a hint calls them; `None` for the kinds vmplane does not manage.
fn kind_names(kind: Kind) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match kind {
        Kind::VirtualMachine => ("vm", "vms", "VMs"),
        Kind::VirtualMachineInstance => ("vmi", "vmis", "VMIs"),
        Kind::VirtualMachineInstancetype => ("instancetype", "instancetypes", "instancetypes"),
        Kind::VirtualMachineClusterInstancetype => (
            "clusterinstancetype",
            "clusterinstancetypes",
            "cluster instancetypes",
        ),
        Kind::VirtualMachinePreference => ("preference", "preferences", "preferences"),
        Kind::VirtualMachineClusterPreference => (
            "clusterpreference",
            "clusterpreferences",
            "cluster preferences",
        ),
        Kind::KubeVirt => ("kubevirt", "kubevirt", "KubeVirt configurations"),
        Kind::VirtualMachineSnapshot => ("snapshot", "snapshots", "snapshots"),
        Kind::VirtualMachineRestore => ("restore", "restores", "restores"),
        Kind::VirtualMachineClone => ("clone", "clones", "clones"),
        Kind::VirtualMachinePool
        | Kind::VirtualMachineInstanceReplicaSet
        | Kind::VirtualMachineInstanceMigration => return None,
    })
}

/// ` -n NS` for a kind that lives in a namespace, else nothing.
fn namespace_flag(kind: Kind, namespace: &str) -> String {
    if kind.cluster_wide() {
        String::new()
    } else {
        format!(" -n {namespace}")
    }
}

/// `Kind ns/name` (`Kind name` for a cluster-wide kind), as the server names an object.
fn object_title(kind: Kind, namespace: &str, name: &str) -> String {
    if kind.cluster_wide() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// A request's object, named as the server names it and as the CLI names its kind.
struct Named<'a> {
    about: &'a About<'a>,
    /// `VirtualMachine ns/name`, as the server's messages start.
    title: String,
    /// `get`'s singular and plural of the kind (`vm`, `vms`).
    one: &'static str,
    many: &'static str,
    /// What a hint calls objects of the kind (`VMs`).
    noun: &'static str,
    /// ` -n NS`, or nothing for a cluster-wide kind.
    ns: String,
}

impl<'a> Named<'a> {
    /// `None` for a kind the CLI does not know or vmplane does not manage.
    fn of(about: &'a About<'a>) -> Option<Named<'a>> {
        let kind = Kind::from_cli_name(about.kind)?;
        let (one, many, noun) = kind_names(kind)?;
        Some(Named {
            about,
            title: object_title(kind, about.namespace, about.name),
            one,
            many,
            noun,
            ns: namespace_flag(kind, about.namespace),
        })
    }
}

/// What to do next after `status`, when its message does not say it already.
fn hint(status: &Status, about: Option<&About<'_>>) -> Option<String> {
    let message = status.message();
    let reasons = status
        .metadata()
        .get(crate::status::REASONS_KEY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let named = about.and_then(Named::of);
    match status.code() {
        tonic::Code::Unauthenticated if message.contains("--token") => None,
        tonic::Code::Unauthenticated if message.contains("not valid") => {
            Some("check the token given with --token or VMPLANE_TOKEN".into())
        }
        tonic::Code::Unauthenticated => Some("pass --token or set VMPLANE_TOKEN".into()),
        // vmplane's servers say which role to ask an admin for.
        tonic::Code::PermissionDenied
            if message.contains("ask an admin") || message.contains("admin role") =>
        {
            None
        }
        tonic::Code::PermissionDenied => Some(
            "the token's principal has no role that allows this: ask an admin for one, or \
             check --token or VMPLANE_TOKEN"
                .into(),
        ),
        tonic::Code::NotFound => {
            let Named {
                about,
                title,
                one,
                many,
                noun,
                ns,
            } = named?;
            // Only about the object named: a reference it holds (`spec.instancetype`) is not.
            let rest = message.strip_prefix(&title)?;
            if crate::status::has_reason(status, crate::status::REVISION_NOT_FOUND) {
                Some(format!(
                    "`vmplane history {one} {}{ns}` lists its revisions",
                    about.name
                ))
            } else if !(rest.starts_with(" not found") || rest.starts_with(": metadata.name:")) {
                None
            } else if let Some(then) = about.then.as_deref().filter(|_| rest.contains(" at ")) {
                Some(format!(
                    "list the {noun} at that point with `vmplane get {many}{ns} {then}`"
                ))
            } else {
                Some(format!("list the {noun} with `vmplane get {many}{ns}`"))
            }
        }
        tonic::Code::Aborted => Some(match named {
            Some(Named { about, one, ns, .. }) => format!(
                "re-read it with `vmplane get {one} {}{ns}`, then retry",
                about.name
            ),
            None => "re-read the object with `vmplane get`, then retry".into(),
        }),
        // A VM being deleted: the server's message says what to wait for.
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists
            if reasons
                .split(',')
                .any(|r| r == vmplane_core::codes::BEING_DELETED) =>
        {
            None
        }
        tonic::Code::FailedPrecondition
            if reasons
                .split(',')
                .any(|r| r == vmplane_core::codes::FEATURE_NOT_ENABLED) =>
        {
            Some(
                "`vmplane features` shows the cluster's features; an admin enables one in the \
                 KubeVirt configuration"
                    .into(),
            )
        }
        tonic::Code::FailedPrecondition => {
            let Named { about, ns, .. } = named?;
            about.verb?;
            let name = about.name;
            let shows = format!("`vmplane get vm {name}{ns}` shows its status");
            // A command is suggested only when the VM, as read after the refusal, accepts it.
            let accepts = |verb| about.vm.is_some_and(|vm| vm.accepts(verb));
            Some(
                if message.ends_with("is already running") && accepts(Verb::Restart) {
                    format!("{shows}; `vmplane restart {name}{ns}` restarts it")
                } else if !message.ends_with("is already running") && accepts(Verb::Start) {
                    format!("`vmplane start {name}{ns}` starts it; {shows}")
                } else {
                    format!("{shows} and run strategy")
                },
            )
        }
        _ => None,
    }
}

/// The server's refusal of a document over the manifest limit (ResourceExhausted, naming the
/// object and the limit), made without sending it; `None` if it is within the limit.
fn too_large(doc: &str, namespace: &str) -> Option<tonic::Status> {
    use vmplane_core::limits::MANIFEST_BYTES_MAX;
    if doc.len() <= MANIFEST_BYTES_MAX {
        return None;
    }
    let name = serde_json::from_str::<serde_json::Value>(doc)
        .ok()
        .and_then(|value| crate::api::manifest_name(&value, namespace))
        .unwrap_or_else(|| "manifest".to_string());
    let rejection = vmplane_core::Rejection::from(vmplane_core::types::ParseError::TooLarge {
        bytes: doc.len(),
        bytes_max: MANIFEST_BYTES_MAX,
    });
    Some(crate::status::from_rejection(&name, &rejection))
}

/// A refusal of one object of `-f`, saying where the object is in the input when the
/// message alone would not: the server parses each object alone, as its document 0, and names
/// it (`VirtualMachine ns/name: ...`) when it can. A `document 0` becomes the object's place; an
/// object that is not named (`manifest: ...`), or one among others (several documents, a
/// list's items, a directory), gets its place after the name.
fn located(status: tonic::Status, unit: &Unit, namespace: &str) -> tonic::Status {
    let message = status.message();
    let place = &unit.place;
    let text = if message.contains("document 0: ") {
        message.replacen("document 0: ", &format!("{place}: "), 1)
    } else {
        let named = crate::api::manifest_name(&unit.value, namespace);
        if named.is_some() && !unit.among_others {
            return status;
        }
        let object = named.unwrap_or_else(|| "manifest".to_string());
        match message.strip_prefix(&format!("{object}: ")) {
            Some(rest) => format!("{object}: {place}: {rest}"),
            None => format!("{place}: {message}"),
        }
    };
    tonic::Status::with_metadata(status.code(), text, status.metadata().clone())
}

/// An object of `-f` in another namespace than the one `-n` named explicitly (kubectl's rule:
/// with `-n`, a file may not write elsewhere).
#[derive(Debug, thiserror::Error)]
#[error(
    "{object}: {place}metadata.namespace: the namespace from the provided object \"{from_object}\" \
     does not match the namespace \"{given}\". You must pass '--namespace={from_object}' to \
     perform this operation."
)]
pub struct NamespaceMismatch {
    /// `VirtualMachine secret/demo`.
    pub object: String,
    /// `document 2: ` when the object is among others, else empty.
    pub place: String,
    /// The object's `metadata.namespace`.
    pub from_object: String,
    /// `-n`'s value.
    pub given: String,
}

/// The refusal of `unit` when `-n` was given and the object says another namespace; `None`
/// otherwise, and for cluster-scoped kinds (and kinds the server will refuse anyway).
fn namespace_mismatch(g: &GlobalArgs, unit: &Unit) -> Option<NamespaceMismatch> {
    if !g.namespace_explicit {
        return None;
    }
    let from_object = unit
        .value
        .pointer("/metadata/namespace")?
        .as_str()
        .filter(|ns| !ns.is_empty())?;
    let kind = vmplane_core::types::Kind::from_cli_name(unit.value.get("kind")?.as_str()?)?;
    if !kind.namespaced() || from_object == g.namespace {
        return None;
    }
    Some(NamespaceMismatch {
        object: crate::api::manifest_name(&unit.value, &g.namespace)
            .unwrap_or_else(|| "manifest".to_string()),
        place: if unit.among_others {
            format!("{}: ", unit.place)
        } else {
            String::new()
        },
        from_object: from_object.to_string(),
        given: g.namespace.clone(),
    })
}

/// The objects `-f FILE|DIR|-` holds: those that may be sent, in order, and the refusals of
/// the others (another namespace than an explicit `-n`).
struct Objects {
    units: Vec<Unit>,
    /// How many the input held.
    total: usize,
    failures: Vec<anyhow::Error>,
}

fn objects_of(g: &GlobalArgs, files: &[String], recursive: bool) -> anyhow::Result<Objects> {
    let read = input::read_all(files, recursive)?;
    let total = read.len();
    let (mut units, mut failures) = (Vec::with_capacity(total), Vec::new());
    for unit in read {
        match namespace_mismatch(g, &unit) {
            Some(refused) => failures.push(anyhow::Error::from(refused)),
            None => units.push(unit),
        }
    }
    Ok(Objects {
        units,
        total,
        failures,
    })
}

/// `apply` and `import`: every object of every `-f`, sent one by one in dependency order
/// ([`input::dependency_order`]), each line printed as its object is applied.
pub async fn apply(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &ApplyArgs,
    import: bool,
) -> anyhow::Result<()> {
    let Objects {
        mut units,
        total,
        mut failures,
    } = objects_of(g, &a.file, a.recursive)?;
    input::dependency_order(&mut units);
    let mut out = std::io::stdout().lock();
    // With -o json|yaml, the objects written, printed at the end: one object for a one-object
    // input, else a `List` (kubectl's shape), at the position of the last write.
    let mut written: Vec<pb::Object> = Vec::new();
    let mut written_at = 0;
    // A dry run's instancetypes and preferences that this input would create (they do not
    // exist yet): a VM referring to one cannot be checked against it.
    let mut would_create = WouldCreate::default();
    let mut unsent = 0;
    let mut units = units.into_iter();
    while let Some(unit) = units.next() {
        let doc = unit.json();
        // Over the manifest limit: refused here, named, as the server would refuse it (past
        // the request limit the server could only say the message was too long).
        if let Some(refused) = too_large(&doc, &g.namespace) {
            failures.push(status_error(located(refused, &unit, &g.namespace)));
            continue;
        }
        let resp = c
            .objects
            .apply(pb::ApplyRequest {
                manifest: doc,
                namespace: g.namespace.clone(),
                expected_generation: a.expected_generation,
                dry_run: a.dry_run,
                import,
                request_id: uuid::Uuid::now_v7().to_string(),
                expected_resource_version: None,
                view: written_view(g.output),
            })
            .await;
        match resp {
            Ok(r) => {
                let r = r.into_inner();
                let obj = r.object.unwrap_or_default();
                // kubectl's habit: admission warnings on stderr, the exit status unchanged.
                for warning in &r.warnings {
                    eprintln!(
                        "Warning: {}/{}: {warning}",
                        print::short_kind(&obj.kind),
                        obj.name
                    );
                }
                if a.dry_run && r.outcome == "created" {
                    would_create.add(&unit, &g.namespace);
                }
                let suffix = if a.dry_run { " (dry run)" } else { "" };
                match g.output {
                    Some(Output::Json | Output::Yaml) => {
                        written_at = written_at.max(r.position);
                        written.push(obj);
                    }
                    Some(Output::Name) => print::object(&mut out, g.output, &obj)?,
                    None | Some(Output::Table | Output::Wide) => writeln!(
                        out,
                        "{}/{} {}{suffix}",
                        print::short_kind(&obj.kind),
                        obj.name,
                        r.outcome
                    )?,
                }
            }
            Err(status) => {
                if a.dry_run
                    && let Some(why) = would_create.unchecked(&status, &unit, &g.namespace)
                {
                    let line = format!(
                        "virtualmachine/{} not checked (dry run): {why}",
                        unit.value
                            .pointer("/metadata/name")
                            .and_then(serde_json::Value::as_str)
                            .unwrap_or_default(),
                    );
                    match g.output {
                        None | Some(Output::Table | Output::Wide) => writeln!(out, "{line}")?,
                        Some(Output::Name | Output::Json | Output::Yaml) => {
                            eprintln!("vmplane: warning: {line}");
                        }
                    }
                    continue;
                }
                // A conflict is about the object written; other refusals may be about
                // what it references (an instancetype), which no hint could name.
                let about = (status.code() == tonic::Code::Aborted)
                    .then(|| about_manifest(&unit, &g.namespace))
                    .flatten();
                let stop = unreachable(&status);
                let status = located(status, &unit, &g.namespace);
                failures.push(status_error_about(status, about.as_ref()));
                if stop {
                    unsent = units.len();
                    break;
                }
            }
        }
    }
    match written.as_slice() {
        [] => {}
        [one] if total == 1 => print::object(&mut out, g.output, one)?,
        all => print::list(&mut out, g.output, all, written_at)?,
    }
    outcome(failures, unsent, total, "applied")
}

/// The instancetypes and preferences a dry run found it would create, with their places in
/// the input: what a VM of the same input may refer to before it exists.
#[derive(Debug, Default)]
struct WouldCreate {
    /// (kind, namespace, name) → place; the namespace is empty for a cluster-wide kind.
    objects: std::collections::BTreeMap<(Kind, String, String), String>,
}

impl WouldCreate {
    /// Records `unit`, a dry run of which answered `created`, if it is an instancetype or a
    /// preference.
    fn add(&mut self, unit: &Unit, namespace: &str) {
        let Some(kind) = unit
            .value
            .get("kind")
            .and_then(serde_json::Value::as_str)
            .and_then(Kind::from_cli_name)
            .filter(|k| {
                matches!(
                    k,
                    Kind::VirtualMachineInstancetype
                        | Kind::VirtualMachineClusterInstancetype
                        | Kind::VirtualMachinePreference
                        | Kind::VirtualMachineClusterPreference
                )
            })
        else {
            return;
        };
        let Some(name) = unit
            .value
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
        else {
            return;
        };
        let namespace = if kind.namespaced() {
            unit.value
                .pointer("/metadata/namespace")
                .and_then(serde_json::Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or(namespace)
        } else {
            ""
        };
        self.objects.insert(
            (kind, namespace.to_owned(), name.to_owned()),
            unit.place.clone(),
        );
    }

    /// Why the dry run of the VM of `unit` could not be checked, when `status` refuses it only
    /// because an instancetype or preference it refers to does not exist, and this input
    /// creates every one of those ([`WouldCreate::add`]): its apply would create them first.
    /// `None` when it is refused for anything else, which its apply would be too.
    fn unchecked(&self, status: &Status, unit: &Unit, namespace: &str) -> Option<String> {
        use vmplane_core::codes::{INSTANCETYPE_NOT_FOUND, PREFERENCE_NOT_FOUND};
        if status.code() != tonic::Code::NotFound
            || unit.value.get("kind").and_then(serde_json::Value::as_str) != Some("VirtualMachine")
        {
            return None;
        }
        let reasons: Vec<&str> = status
            .metadata()
            .get(crate::status::REASONS_KEY)
            .and_then(|v| v.to_str().ok())?
            .split(',')
            .collect();
        if reasons.is_empty()
            || reasons
                .iter()
                .any(|r| *r != INSTANCETYPE_NOT_FOUND && *r != PREFERENCE_NOT_FOUND)
        {
            return None;
        }
        let vm: vmplane_core::types::VirtualMachine =
            serde_json::from_value(unit.value.clone()).ok()?;
        let vm_namespace = vm
            .metadata
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or(namespace);
        let refs = vmplane_core::instancetype::references(&vm);
        let mut missing = Vec::new();
        for (code, field, what, reference) in [
            (
                INSTANCETYPE_NOT_FOUND,
                "spec.instancetype.name",
                "instancetype",
                refs.instancetype,
            ),
            (
                PREFERENCE_NOT_FOUND,
                "spec.preference.name",
                "preference",
                refs.preference,
            ),
        ] {
            if !reasons.contains(&code) {
                continue;
            }
            let (kind, name) = reference?;
            let ns = if kind.namespaced() { vm_namespace } else { "" };
            let place = self.objects.get(&(kind, ns.to_owned(), name.clone()))?;
            missing.push((
                format!("{field}: {} ({place})", object_title(kind, ns, &name)),
                what,
            ));
        }
        match missing.as_slice() {
            [] => None,
            [(one, what)] => Some(format!(
                "{one} does not exist yet: this input creates it, and a VM is checked against \
                 its {what} only once that exists"
            )),
            [(first, _), (second, _)] => Some(format!(
                "{first} and {second} do not exist yet: this input creates them, and a VM is \
                 checked against its instancetype and preference only once they exist"
            )),
            _ => None,
        }
    }
}

/// What an error about the object of `unit` is about: its kind, namespace (`namespace` when
/// it names none) and name, when it names them.
fn about_manifest<'a>(unit: &'a Unit, namespace: &'a str) -> Option<About<'a>> {
    let text = |pointer: &str| {
        unit.value
            .pointer(pointer)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
    };
    Some(About::object(
        text("/kind")?,
        text("/metadata/namespace").unwrap_or(namespace),
        text("/metadata/name")?,
    ))
}

/// How much of a written object to ask back for the output `format`: the object only when
/// it is printed (`-o json|yaml`); `KIND/NAME` lines need its kind and name alone.
fn written_view(format: Option<Output>) -> i32 {
    match format {
        Some(Output::Json | Output::Yaml) => pb::ObjectView::Full,
        None | Some(Output::Name | Output::Table | Output::Wide) => pb::ObjectView::Basic,
    }
    .into()
}

/// The end of a command over the objects of `-f`: one failure is the command's one error
/// line; several get a line each, then a count of the `total` not `done`. The loop stops at
/// the first [`unreachable`] answer, since every later object would fail the same way, one
/// line each: `unsent` counts those it did not send.
fn outcome(
    mut failures: Vec<anyhow::Error>,
    unsent: usize,
    total: usize,
    done: &str,
) -> anyhow::Result<()> {
    let not_done = failures.len() + unsent;
    if unsent == 0 && not_done == 1 {
        return Err(failures.remove(0));
    }
    if not_done == 0 {
        return Ok(());
    }
    for failure in &failures {
        eprintln!("vmplane: error: {failure:#}");
    }
    if unsent > 0 {
        bail!(
            "{not_done} of {total} objects not {done}: the server could not be reached, so \
             the last {unsent} were not sent"
        )
    }
    bail!("{not_done} of {total} objects not {done}")
}

/// An answer that says the server could not be reached (or is going away): a loop over many
/// objects stops sending at it.
fn unreachable(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable
}

fn point_in_time(a: &GetArgs) -> Option<pb::PointInTime> {
    use pb::point_in_time::At;
    let at = if let Some(r) = a.revision {
        At::Revision(r)
    } else if let Some(p) = a.at_position {
        At::Position(p)
    } else if let Some(t) = &a.as_of {
        At::AsOf(t.clone())
    } else {
        return None;
    };
    Some(pb::PointInTime { at: Some(at) })
}

/// `get`.
pub async fn get(c: &mut Clients, g: &GlobalArgs, a: &GetArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match &a.name {
        Some(name) => {
            let resp = c
                .objects
                .get(pb::GetRequest {
                    r#ref: Some(pb::ObjectRef {
                        kind: a.kind.clone(),
                        namespace: g.namespace.clone(),
                        name: name.clone(),
                    }),
                    at: point_in_time(a),
                    min_position: 0,
                })
                .await
                .map_err(|status| {
                    let then = match (a.at_position, &a.as_of) {
                        (Some(p), _) => Some(format!("--at-position {p}")),
                        (None, Some(t)) => Some(format!("--as-of {t}")),
                        (None, None) => None,
                    };
                    let about = About {
                        then,
                        ..About::object(&a.kind, &g.namespace, name)
                    };
                    status_error_about(status, Some(&about))
                })?
                .into_inner();
            let obj = resp.object.unwrap_or_default();
            match g.output {
                None | Some(Output::Table | Output::Wide) => {
                    print::object_table(&mut out, &[obj], &table_options(g, a))?
                }
                other => print::object(&mut out, other, &obj)?,
            }
        }
        None => {
            let resp = list_all(c, g, ListQuery::of_get(a)).await?;
            match g.output {
                None | Some(Output::Table | Output::Wide | Output::Name) => {
                    if resp.items.is_empty() {
                        let cluster_scoped = vmplane_core::types::Kind::from_cli_name(&a.kind)
                            .is_some_and(|k| k.cluster_wide());
                        if cluster_scoped {
                            eprintln!("No resources found.");
                        } else if a.all_namespaces {
                            eprintln!("No resources found in any namespace.");
                        } else {
                            eprintln!("No resources found in namespace {}.", g.namespace);
                        }
                    } else if g.output == Some(Output::Name) {
                        print::list(&mut out, g.output, &resp.items, resp.read_position)?;
                    } else {
                        print::object_table(&mut out, &resp.items, &table_options(g, a))?;
                    }
                }
                other => print::list(&mut out, other, &resp.items, resp.read_position)?,
            }
        }
    }
    Ok(())
}

/// `get`'s table: its namespace column with `-A`, `-o wide`, `-L` and `--show-labels`.
fn table_options(g: &GlobalArgs, a: &GetArgs) -> print::TableOptions {
    print::TableOptions {
        with_ns: a.all_namespaces && a.name.is_none(),
        wide: g.output == Some(Output::Wide),
        label_columns: a.label_columns.clone(),
        show_labels: a.show_labels,
    }
}

/// What a list reads: `get`'s list, or the objects a `delete -l` deletes.
struct ListQuery<'a> {
    kind: &'a str,
    all_namespaces: bool,
    /// Objects per page (0: one response).
    chunk_size: u32,
    /// A point in the past, or now (`None`).
    at: Option<pb::PointInTime>,
    /// A label selector, or `""` for every object.
    selector: &'a str,
}

impl<'a> ListQuery<'a> {
    fn of_get(a: &'a GetArgs) -> ListQuery<'a> {
        ListQuery {
            kind: &a.kind,
            all_namespaces: a.all_namespaces,
            chunk_size: a.chunk_size,
            at: point_in_time(a),
            selector: a.selector.as_deref().unwrap_or_default(),
        }
    }
}

/// A whole list, in pages of `chunk_size` read at one position (the first page's).
async fn list_all(
    c: &mut Clients,
    g: &GlobalArgs,
    q: ListQuery<'_>,
) -> anyhow::Result<pb::ListResponse> {
    let mut whole = pb::ListResponse::default();
    let mut token = String::new();
    loop {
        let page = c
            .objects
            .list(pb::ListRequest {
                kind: q.kind.to_owned(),
                namespace: g.namespace.clone(),
                all_namespaces: q.all_namespaces,
                min_position: 0,
                limit: q.chunk_size,
                // The first page names the point in the past; later ones carry it in the token.
                at: if token.is_empty() { q.at.clone() } else { None },
                continue_token: std::mem::take(&mut token),
                label_selector: q.selector.to_owned(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        whole.items.extend(page.items);
        whole.read_position = page.read_position;
        if page.continue_token.is_empty() {
            return Ok(whole);
        }
        token = page.continue_token;
    }
}

/// `delete`: one object by kind and name, or every object `-f` names (by its kind, name and
/// namespace, as `apply -f` wrote it).
pub async fn delete(c: &mut Clients, g: &GlobalArgs, a: &DeleteArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if let (Some(kind), Some(selector)) = (&a.kind, &a.selector) {
        return delete_selected(c, g, a, kind, selector, &mut out).await;
    }
    if a.file.is_empty() {
        // clap requires both without -f or -l.
        let (Some(kind), Some(name)) = (&a.kind, &a.name) else {
            bail!(
                "delete: name the object (KIND NAME), a selector (KIND -l SELECTOR) or a file (-f FILE)"
            );
        };
        let target = Target {
            kind,
            namespace: &g.namespace,
            name,
        };
        let deleted = delete_one(c, a, &target)
            .await
            .map_err(|status| status_error_about(status, Some(&target.about())))?;
        if deleted {
            said_deleted(&mut out, g, &target, false)?;
        }
        return Ok(());
    }
    let Objects {
        units,
        total,
        mut failures,
    } = objects_of(g, &a.file, a.recursive)?;
    let mut unsent = 0;
    let mut units = units.into_iter();
    while let Some(unit) = units.next() {
        let text = |pointer: &str| {
            unit.value
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let (Some(kind), Some(name)) = (text("/kind"), text("/metadata/name")) else {
            failures.push(anyhow::anyhow!(
                "{}: kind and metadata.name are needed to delete an object",
                unit.place
            ));
            continue;
        };
        let target = Target {
            kind,
            namespace: text("/metadata/namespace").unwrap_or(&g.namespace),
            name,
        };
        match delete_one(c, a, &target).await {
            Ok(true) => said_deleted(&mut out, g, &target, false)?,
            Ok(false) => {}
            Err(status) => {
                let stop = unreachable(&status);
                failures.push(status_error_about(
                    located(status, &unit, &g.namespace),
                    Some(&target.about()),
                ));
                if stop {
                    unsent = units.len();
                    break;
                }
            }
        }
    }
    outcome(failures, unsent, total, "deleted")
}

/// `delete KIND -l SELECTOR`: every object of the kind in the namespace whose labels match,
/// listed now and deleted one by one. One that is gone by the time it is deleted was deleted
/// by someone else: not an error.
async fn delete_selected(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &DeleteArgs,
    kind: &str,
    selector: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let listed = list_all(
        c,
        g,
        ListQuery {
            kind,
            all_namespaces: a.all_namespaces,
            chunk_size: 500,
            at: None,
            selector,
        },
    )
    .await?;
    if listed.items.is_empty() {
        if a.all_namespaces {
            eprintln!("No resources found in any namespace.");
        } else {
            eprintln!("No resources found in namespace {}.", g.namespace);
        }
        return Ok(());
    }
    let total = listed.items.len();
    let mut failures = Vec::new();
    let tolerant = DeleteArgs {
        ignore_not_found: true,
        ..a.clone()
    };
    let mut unsent = 0;
    let mut items = listed.items.iter();
    while let Some(item) = items.next() {
        let target = Target {
            kind,
            namespace: &item.namespace,
            name: &item.name,
        };
        match delete_one(c, &tolerant, &target).await {
            Ok(true) => said_deleted(out, g, &target, a.all_namespaces)?,
            Ok(false) => {}
            Err(status) => {
                let stop = unreachable(&status);
                failures.push(status_error_about(status, Some(&target.about())));
                if stop {
                    unsent = items.len();
                    break;
                }
            }
        }
    }
    outcome(failures, unsent, total, "deleted")
}

/// The object a `delete` is about.
struct Target<'a> {
    /// As written: `vm`, `VirtualMachine`, … (the server reads kubectl's forms).
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
}

impl Target<'_> {
    /// What an error about it is about.
    fn about(&self) -> About<'_> {
        About::object(self.kind, self.namespace, self.name)
    }
}

/// Deletes one object: whether it was there (`false` only with `--ignore-not-found`).
async fn delete_one(
    c: &mut Clients,
    a: &DeleteArgs,
    target: &Target<'_>,
) -> Result<bool, tonic::Status> {
    let deleted = c
        .objects
        .delete(pb::DeleteRequest {
            r#ref: Some(pb::ObjectRef {
                kind: target.kind.to_owned(),
                namespace: target.namespace.to_owned(),
                name: target.name.to_owned(),
            }),
            expected_generation: a.expected_generation,
            request_id: uuid::Uuid::now_v7().to_string(),
        })
        .await;
    match deleted {
        Ok(_) => Ok(true),
        Err(status) if status.code() == tonic::Code::NotFound && a.ignore_not_found => Ok(false),
        Err(status) => Err(status),
    }
}

/// `KIND/NAME deleted` (`KIND/NAME` with `-o name`), `… deleted from namespace NS` when
/// `with_ns` (a delete across namespaces, where names alone are ambiguous).
fn said_deleted(
    out: &mut impl Write,
    g: &GlobalArgs,
    target: &Target<'_>,
    with_ns: bool,
) -> std::io::Result<()> {
    let kind = vmplane_core::types::Kind::from_cli_name(target.kind)
        .map(|k| print::short_kind(k.as_str()))
        .unwrap_or_else(|| print::short_kind_of_arg(target.kind));
    match (g.output == Some(Output::Name), with_ns) {
        (true, _) => writeln!(out, "{kind}/{}", target.name),
        (false, false) => writeln!(out, "{kind}/{} deleted", target.name),
        (false, true) => writeln!(
            out,
            "{kind}/{} deleted from namespace {}",
            target.name, target.namespace
        ),
    }
}

/// The object as it is now, read at least as far as `min_position`.
async fn read_now(
    c: &mut Clients,
    object: pb::ObjectRef,
    min_position: u64,
) -> Result<pb::Object, tonic::Status> {
    let read = c
        .objects
        .get(pb::GetRequest {
            r#ref: Some(object),
            at: None,
            min_position,
        })
        .await?;
    Ok(read.into_inner().object.unwrap_or_default())
}

/// An object's JSON as the server sent it.
fn object_json(object: &pb::Object, kind: &str, name: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(&object.json)
        .with_context(|| format!("{kind} {name}: the server sent an object that is not JSON"))
}

/// How many times a read-modify-write (`patch`, `label`, `annotate`) reads again after another
/// write came between its read and its write, before it gives up.
const REWRITE_ATTEMPTS: u32 = 5;

/// Reads one object, changes its JSON with `change`, and writes it back with `apply`,
/// conditional on the resourceVersion it read: a write by anyone else in between is never
/// overwritten; the object is read and changed again instead. `done` is the verb printed
/// (`patched`, `labeled`, ...; `(no change)` added when the write changed nothing).
async fn rewrite(
    c: &mut Clients,
    g: &GlobalArgs,
    (kind, name): (&str, &str),
    dry_run: bool,
    done: &str,
    change: impl Fn(&mut serde_json::Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let object = pb::ObjectRef {
            kind: kind.to_owned(),
            namespace: g.namespace.clone(),
            name: name.to_owned(),
        };
        let about = About::object(kind, &g.namespace, name);
        let read = read_now(c, object, 0)
            .await
            .map_err(|status| status_error_about(status, Some(&about)))?;
        let mut doc = object_json(&read, kind, name)?;
        change(&mut doc)?;
        let written = c
            .objects
            .apply(pb::ApplyRequest {
                manifest: doc.to_string(),
                namespace: g.namespace.clone(),
                expected_generation: None,
                dry_run,
                import: false,
                request_id: uuid::Uuid::now_v7().to_string(),
                expected_resource_version: Some(read.resource_version),
                view: written_view(g.output),
            })
            .await;
        let r = match written {
            Ok(r) => r.into_inner(),
            Err(status) if status.code() == tonic::Code::Aborted && attempt < REWRITE_ATTEMPTS => {
                continue;
            }
            Err(status) => return Err(status_error_about(status, Some(&about))),
        };
        let obj = r.object.unwrap_or_default();
        let mut out = std::io::stdout().lock();
        match g.output {
            Some(Output::Json | Output::Yaml | Output::Name) => {
                print::object(&mut out, g.output, &obj)?;
            }
            None | Some(Output::Table | Output::Wide) => {
                let unchanged = if r.outcome == "unchanged" {
                    " (no change)"
                } else {
                    ""
                };
                let dry = if dry_run { " (dry run)" } else { "" };
                writeln!(
                    out,
                    "{}/{} {done}{unchanged}{dry}",
                    print::short_kind(&obj.kind),
                    obj.name
                )?;
            }
        }
        return Ok(());
    }
}

/// `patch`: a merge patch or a JSON patch, applied to the object as read.
pub async fn patch(c: &mut Clients, g: &GlobalArgs, a: &PatchArgs) -> anyhow::Result<()> {
    let text = match (&a.patch, &a.patch_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) if file == "-" => std::io::read_to_string(std::io::stdin())
            .context("--patch-file -: reading standard input")?,
        (None, Some(file)) => {
            std::fs::read_to_string(file).with_context(|| format!("--patch-file {file}"))?
        }
        (None, None) => bail!("patch: give the patch with -p PATCH or --patch-file FILE"),
    };
    // JSON is YAML too; YAML's parser says where a malformed patch goes wrong.
    let patch: serde_json::Value = serde_yaml::from_str(&text)
        .map_err(|e| anyhow!("the patch is neither JSON nor YAML: {e}"))?;
    let ops = match a.patch_type {
        PatchType::Merge if !patch.is_object() => {
            bail!("a merge patch is an object, as in {{\"spec\":{{\"runStrategy\":\"Always\"}}}}")
        }
        PatchType::Merge => Vec::new(),
        PatchType::Json => {
            let Some(list) = patch.as_array() else {
                bail!(
                    "a JSON patch is a list of operations, as in \
                     [{{\"op\":\"replace\",\"path\":\"/spec/runStrategy\",\"value\":\"Always\"}}]"
                );
            };
            list.iter()
                .enumerate()
                .map(|(i, op)| {
                    vmplane_core::jsonpatch::parse(&op.to_string())
                        .map_err(|e| anyhow!("the patch's operation {i}: {e}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        }
    };
    rewrite(c, g, (&a.kind, &a.name), a.dry_run, "patched", |doc| {
        match a.patch_type {
            PatchType::Merge => vmplane_core::jsonpatch::merge_patch(doc, &patch),
            PatchType::Json => {
                *doc = vmplane_core::jsonpatch::apply_all(doc, &ops)
                    .map_err(|e| anyhow!("{} {}: {e}", a.kind, a.name))?;
            }
        }
        Ok(())
    })
    .await
}

/// What `label` and `annotate` change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metadata {
    /// `metadata.labels`
    Labels,
    /// `metadata.annotations`
    Annotations,
}

/// `label` and `annotate`: KEY=VALUE sets (an existing different value only with
/// `--overwrite`), KEY- removes.
pub async fn label(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &MetadataArgs,
    what: Metadata,
) -> anyhow::Result<()> {
    let (field, noun, done) = match what {
        Metadata::Labels => ("labels", "label", "labeled"),
        Metadata::Annotations => ("annotations", "annotation", "annotated"),
    };
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    for change in &a.changes {
        let (key, value) = match change.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => match change.strip_suffix('-') {
                Some(key) => (key, None),
                None => {
                    bail!("{change:?}: write KEY=VALUE to set the {noun}, or KEY- to remove it")
                }
            },
        };
        vmplane_core::selector::check_label_key(key)
            .map_err(|why| anyhow!("{noun} key {key:?}: {why}"))?;
        if let (Metadata::Labels, Some(value)) = (what, value) {
            vmplane_core::selector::check_label_value(value)
                .map_err(|why| anyhow!("label {key}: value {value:?}: {why}"))?;
        }
        if changes.iter().any(|(k, _)| k == key) {
            bail!("{noun} {key:?} is changed twice in one command");
        }
        changes.push((key.to_owned(), value.map(str::to_owned)));
    }
    let (kind, name) = (a.kind.as_str(), a.name.as_str());
    // Keys to remove that the object (as last read) did not have: said once, after the write.
    let missing = std::cell::RefCell::new(Vec::new());
    let written = rewrite(c, g, (kind, name), a.dry_run, done, |doc| {
        missing.borrow_mut().clear();
        let metadata = doc
            .as_object_mut()
            .and_then(|o| o.get_mut("metadata"))
            .and_then(serde_json::Value::as_object_mut)
            .ok_or_else(|| anyhow!("{kind} {name}: the object has no metadata"))?;
        let map = metadata
            .entry(field)
            .or_insert_with(|| serde_json::json!({}));
        if map.is_null() {
            *map = serde_json::json!({});
        }
        let map = map
            .as_object_mut()
            .ok_or_else(|| anyhow!("{kind} {name}: metadata.{field} is not a map"))?;
        for (key, value) in &changes {
            match value {
                Some(value) => {
                    if let Some(old) = map.get(key).and_then(serde_json::Value::as_str)
                        && old != value
                        && !a.overwrite
                    {
                        bail!(
                            "{kind} {name}: metadata.{field}.{key} already has a value ({old:?}), \
                             and --overwrite is not given"
                        );
                    }
                    map.insert(key.clone(), serde_json::Value::String(value.clone()));
                }
                None => {
                    if map.remove(key).is_none() {
                        missing.borrow_mut().push(key.clone());
                    }
                }
            }
        }
        Ok(())
    })
    .await;
    for key in missing.into_inner() {
        eprintln!("{noun} {key:?} not found.");
    }
    written
}

/// How long `wait` goes without reading the object again when no event names it.
const REREAD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `wait`: until the object is what `--for` says, or `--timeout` passes. It watches the
/// namespace's events from before its first read, and reads the object again after each event
/// that names it, so no change between a read and the next event goes unseen.
pub async fn wait(c: &mut Clients, g: &GlobalArgs, a: &WaitArgs) -> anyhow::Result<()> {
    let mut now = String::from("it was not read");
    let waited = tokio::time::timeout(a.timeout, wait_until(c, g, a, &mut now)).await;
    let object = format!("{} {}", a.kind, a.name);
    match waited {
        Ok(Ok(kind)) => {
            println!("{}/{} condition met", print::short_kind(&kind), a.name);
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => bail!(
            "timed out after {:?} waiting for {} of {object}: {now}",
            a.timeout,
            a.wait_for
        ),
    }
}

/// The waiting itself: returns the object's kind (as the server names it) once it holds;
/// `now` says what the object was at the last read.
async fn wait_until(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &WaitArgs,
    now: &mut String,
) -> anyhow::Result<String> {
    // Subscribed first: the server places a watch without a position at its head when asked,
    // so every event after the first read below is delivered.
    let mut events = c
        .watch
        .watch(pb::WatchRequest {
            kind: String::new(),
            namespace: g.namespace.clone(),
            all_namespaces: false,
            from_position: None,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let mut seen = 0;
    loop {
        let object = pb::ObjectRef {
            kind: a.kind.clone(),
            namespace: g.namespace.clone(),
            name: a.name.clone(),
        };
        let object = match read_now(c, object, seen).await {
            Ok(object) => Some(object),
            Err(status) if status.code() == tonic::Code::NotFound => None,
            Err(status) => {
                let about = About::object(&a.kind, &g.namespace, &a.name);
                return Err(status_error_about(status, Some(&about)));
            }
        };
        let doc = match &object {
            Some(o) => Some(object_json(o, &a.kind, &a.name)?),
            None => None,
        };
        match a.wait_for.check(doc.as_ref()) {
            Ok(()) => {
                return Ok(match object {
                    Some(o) => o.kind,
                    None => vmplane_core::types::Kind::from_cli_name(&a.kind)
                        .map(|k| k.as_str().to_owned())
                        .unwrap_or_else(|| a.kind.clone()),
                });
            }
            Err(state) => *now = state,
        }
        // The next event about this object (by name: a VM's stream also carries its VMI's),
        // or a second without one: read again then anyway (a cluster-wide object's events are
        // in no namespace's watch).
        loop {
            let next = tokio::time::timeout(REREAD_EVERY, events.message()).await;
            let Ok(next) = next else { break };
            let Some(event) = next.map_err(status_error)? else {
                bail!("the server ended the watch");
            };
            if event.name == a.name {
                seen = event.position;
                break;
            }
        }
    }
}

/// The lifecycle verbs.
#[derive(Debug, Clone, Copy)]
pub enum Verb {
    /// start
    Start,
    /// stop
    Stop,
    /// restart
    Restart,
}

/// `start`, `stop`, `restart`.
pub async fn lifecycle(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &LifecycleArgs,
    verb: Verb,
) -> anyhow::Result<()> {
    let req = pb::LifecycleRequest {
        namespace: g.namespace.clone(),
        name: a.name.clone(),
        request_id: uuid::Uuid::now_v7().to_string(),
    };
    let (resp, done) = match verb {
        Verb::Start => (c.lifecycle.start(req).await, "start requested"),
        Verb::Stop => (c.lifecycle.stop(req).await, "stop requested"),
        Verb::Restart => (c.lifecycle.restart(req).await, "restart requested"),
    };
    let resp = match resp {
        Ok(resp) => resp.into_inner(),
        Err(status) => {
            // What the hint may suggest depends on the VM's run strategy and state: read it.
            let vm = if status.code() == tonic::Code::FailedPrecondition {
                vm_facts(c, &g.namespace, &a.name).await
            } else {
                None
            };
            let about = About {
                verb: Some(verb),
                vm,
                ..About::object("vm", &g.namespace, &a.name)
            };
            return Err(status_error_about(status, Some(&about)));
        }
    };
    if resp.outcome == "unchanged" {
        println!("virtualmachine/{} unchanged", a.name);
    } else {
        println!("virtualmachine/{} {done}", a.name);
    }
    Ok(())
}

/// The VM `namespace/name` as it is now, for a lifecycle refusal's hint; `None` when it cannot
/// be read (the hint then suggests no command).
async fn vm_facts(c: &mut Clients, namespace: &str, name: &str) -> Option<VmFacts> {
    let object = |kind: &str| pb::ObjectRef {
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
    };
    let vm = read_now(c, object("vm"), 0).await.ok()?;
    let vm: serde_json::Value = serde_json::from_str(&vm.json).ok()?;
    let status = vm.get("status")?;
    let mut facts = VmFacts {
        run_strategy: status
            .get("runStrategy")
            .and_then(serde_json::Value::as_str)
            .and_then(vmplane_core::lifecycle::RunStrategy::parse),
        active: status
            .get("created")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
        vmi_failed: None,
    };
    // Only RerunOnFailure refuses a start for a failed VMI.
    if facts.run_strategy == Some(vmplane_core::lifecycle::RunStrategy::RerunOnFailure)
        && !facts.active
    {
        facts.vmi_failed = match read_now(c, object("vmi"), 0).await {
            Ok(vmi) => serde_json::from_str::<serde_json::Value>(&vmi.json)
                .ok()
                .and_then(|v| {
                    v.pointer("/status/phase")
                        .and_then(serde_json::Value::as_str)
                        .map(|phase| phase == "Failed")
                }),
            Err(status) if status.code() == tonic::Code::NotFound => Some(false),
            Err(_) => None,
        };
    }
    Some(facts)
}

/// `expand`.
pub async fn expand(c: &mut Clients, g: &GlobalArgs, a: &ExpandArgs) -> anyhow::Result<()> {
    use pb::expand_request::Source;
    let mut unit = None;
    let source = match (a.file.as_slice(), &a.kind, &a.name) {
        (files @ [_, ..], _, _) => {
            let mut units = input::read_all(files, false)?;
            if units.len() != 1 {
                bail!(
                    "-f {}: expand takes exactly one VirtualMachine, found {} objects; \
                     expand them one file at a time",
                    files.join(" -f "),
                    units.len()
                );
            }
            let one = units.remove(0);
            if let Some(refused) = namespace_mismatch(g, &one) {
                return Err(refused.into());
            }
            let manifest = one.json();
            unit = Some(one);
            Source::Manifest(manifest)
        }
        ([], Some(kind), Some(name)) => Source::Ref(pb::ObjectRef {
            kind: kind.clone(),
            namespace: g.namespace.clone(),
            name: name.clone(),
        }),
        _ => bail!("expand needs `vm NAME` or -f FILE"),
    };
    let resp = c
        .objects
        .expand(pb::ExpandRequest {
            source: Some(source),
            namespace: g.namespace.clone(),
        })
        .await
        .map_err(|status| match (&unit, &a.kind, &a.name) {
            (Some(unit), _, _) => status_error(located(status, unit, &g.namespace)),
            (None, Some(kind), Some(name)) => {
                status_error_about(status, Some(&About::object(kind, &g.namespace, name)))
            }
            (None, _, _) => status_error(status),
        })?
        .into_inner();
    let value: serde_json::Value =
        serde_json::from_str(&resp.json).context("the server sent invalid JSON")?;
    let mut out = std::io::stdout().lock();
    print::value(&mut out, g.output.unwrap_or(Output::Yaml), &value)
}

/// `history`.
pub async fn history(c: &mut Clients, g: &GlobalArgs, a: &HistoryArgs) -> anyhow::Result<()> {
    let resp = c
        .history
        .history(pb::HistoryRequest {
            r#ref: Some(pb::ObjectRef {
                kind: a.kind.clone(),
                namespace: g.namespace.clone(),
                name: a.name.clone(),
            }),
            min_position: 0,
            limit: a.limit,
        })
        .await
        .map_err(|status| {
            status_error_about(status, Some(&About::object(&a.kind, &g.namespace, &a.name)))
        })?
        .into_inner();
    let mut out = std::io::stdout().lock();
    print::history(&mut out, g.output, &resp.revisions)?;
    if resp.older > 0 {
        eprintln!(
            "{} older revisions not shown: raise --limit (now {}), or 0 for all.",
            resp.older, a.limit
        );
    }
    if let Some(vm) = &resp.recorded_in {
        eprintln!(
            "These are {kind} {name}'s revisions that hold its current VMI's events (a VM's VMI \
             is recorded in the VM's history): `vmplane history {kind} {name}` lists them all, \
             and `get --revision`/`diff` take them with {kind} {name}.",
            kind = vm.kind,
            name = vm.name
        );
    }
    Ok(())
}

/// `describe`: the object for people, with its latest events from the log.
pub async fn describe(c: &mut Clients, g: &GlobalArgs, a: &DescribeArgs) -> anyhow::Result<()> {
    if !is_table(g.output) {
        bail!(
            "describe prints for people and takes no -o; for scripts use `vmplane get {kind} \
             {name} -o json` and `vmplane history {kind} {name} -o json`",
            kind = a.kind,
            name = a.name
        );
    }
    let object = pb::ObjectRef {
        kind: a.kind.clone(),
        namespace: g.namespace.clone(),
        name: a.name.clone(),
    };
    let about = About::object(&a.kind, &g.namespace, &a.name);
    let obj = read_now(c, object.clone(), 0)
        .await
        .map_err(|status| status_error_about(status, Some(&about)))?;
    // A VM's VMI is answered with the VM's rows that hold the current VMI's events.
    let revisions = c
        .history
        .history(pb::HistoryRequest {
            r#ref: Some(object),
            // Read at least as far as the object just shown, so its last event is listed.
            min_position: obj.resource_version,
            limit: u32::try_from(a.events).unwrap_or(u32::MAX),
        })
        .await
        .map_err(|status| status_error_about(status, Some(&about)))?
        .into_inner()
        .revisions;
    let mut out = std::io::stdout().lock();
    print::describe(&mut out, &obj, &revisions, a.events)
}

/// Whether results print as a table (where an empty one is a line on stderr, as kubectl's).
fn is_table(output: Option<Output>) -> bool {
    matches!(output, None | Some(Output::Table | Output::Wide))
}

/// `diff`: returns whether the revisions differ. With `-o json|yaml`, one object `{from, to,
/// equal, diff}` (the unified diff as text, empty when equal) instead of the diff itself.
pub async fn diff(c: &mut Clients, g: &GlobalArgs, a: &DiffArgs) -> anyhow::Result<bool> {
    let about = About::object(&a.kind, &g.namespace, &a.name);
    let object = pb::ObjectRef {
        kind: a.kind.clone(),
        namespace: g.namespace.clone(),
        name: a.name.clone(),
    };
    let structured = matches!(g.output, Some(Output::Json | Output::Yaml));
    // The object says which revision it compared to: the current one is read first, and
    // asked for by number, so the two cannot differ.
    let to = match a.to {
        None if structured => c
            .history
            .history(pb::HistoryRequest {
                r#ref: Some(object.clone()),
                min_position: 0,
                limit: 1,
            })
            .await
            .map_err(|status| status_error_about(status, Some(&about)))?
            .into_inner()
            .revisions
            .last()
            .map(|r| r.revision),
        to => to,
    };
    let resp = c
        .history
        .diff(pb::DiffRequest {
            r#ref: Some(object),
            from_revision: a.from,
            to_revision: to,
        })
        .await
        .map_err(|status| status_error_about(status, Some(&about)))?
        .into_inner();
    let mut out = std::io::stdout().lock();
    if let (Some(format), true) = (g.output, structured) {
        let value = serde_json::json!({
            "from": a.from,
            "to": to,
            "equal": resp.equal,
            "diff": resp.unified_diff,
        });
        print::value(&mut out, format, &value)?;
    } else if !resp.equal {
        let color = std::io::stdout().is_terminal();
        print::unified_diff(&mut out, &resp.unified_diff, color)?;
    }
    Ok(!resp.equal)
}

/// `audit`. The entries of a cluster-scoped kind (`--kind kubevirt`, cluster instancetypes and
/// preferences) are in no namespace: the server's filter by `-n`'s namespace would leave every
/// one out, so they are asked for across namespaces, where the server shows each principal the
/// cluster-scoped entries (which every principal may read) and, of the namespaced ones, only
/// those it may read; `--kind` then leaves only the kind's.
pub async fn audit(c: &mut Clients, g: &GlobalArgs, a: &AuditArgs) -> anyhow::Result<()> {
    let cluster_kind = a
        .kind
        .as_deref()
        .and_then(Kind::from_cli_name)
        .filter(|k| k.cluster_wide());
    let resp = c
        .history
        .audit(pb::AuditRequest {
            actor: a.actor.clone().unwrap_or_default(),
            namespace: g.namespace.clone(),
            all_namespaces: a.all_namespaces || cluster_kind.is_some(),
            kind: a.kind.clone().unwrap_or_default(),
            since: a.since.clone().unwrap_or_default(),
            until: a.until.clone().unwrap_or_default(),
            limit: a.limit,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if resp.entries.is_empty() && is_table(g.output) {
        if let Some(kind) = cluster_kind {
            eprintln!("No audit entries found for {kind} (cluster-scoped: in no namespace).");
        } else if a.all_namespaces {
            eprintln!("No audit entries found in any namespace.");
        } else {
            eprintln!("No audit entries found in namespace {}.", g.namespace);
        }
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    print::audit(&mut out, g.output, &resp.entries)?;
    if resp.older > 0 {
        eprintln!(
            "{} older entries matched too: raise --limit (now {}) or narrow with --since/--until.",
            resp.older, a.limit
        );
    }
    Ok(())
}

/// `watch`: prints events until the server ends the stream or the user interrupts.
pub async fn watch(c: &mut Clients, g: &GlobalArgs, a: &WatchArgs) -> anyhow::Result<()> {
    let stream = c
        .watch
        .watch(pb::WatchRequest {
            kind: a.kind.clone().unwrap_or_default(),
            namespace: g.namespace.clone(),
            all_namespaces: a.all_namespaces,
            from_position: a.from_position,
        })
        .await
        .map_err(status_error)?;
    // A point-in-time restore voided positions this watch will pass: said once, on stderr.
    if let Some(voided) = stream
        .metadata()
        .get(crate::api::VOIDED_POSITIONS_METADATA)
        .and_then(|v| v.to_str().ok())
    {
        eprintln!(
            "vmplane: note: positions {voided} were voided by a point-in-time restore: \
             the watch passes over them"
        );
    }
    let mut stream = stream.into_inner();
    let mut out = std::io::stdout().lock();
    let mut table = print::WatchTable::default();
    while let Some(ev) = stream.message().await.map_err(status_error)? {
        print::watch_event(&mut out, g.output, &ev, &mut table)?;
        out.flush()?;
    }
    Ok(())
}

/// `features` and `features usage FEATURE`.
pub async fn features(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &crate::cli::FeaturesArgs,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match &a.command {
        None => {
            let resp = c
                .cluster
                .features(pb::FeaturesRequest {})
                .await
                .map_err(status_error)?
                .into_inner();
            print::features(&mut out, g.output, &resp.features)
        }
        Some(crate::cli::FeaturesCommand::Usage { feature }) => {
            let resp = c
                .cluster
                .feature_usage(pb::FeatureUsageRequest {
                    feature: feature.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            print::feature_usage(&mut out, g.output, feature, &resp)
        }
    }
}

/// A short random suffix for generated object names (KubeVirt-like `-abc12`).
fn name_suffix() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..5].to_owned()
}

/// A shorthand's source (the VM to snapshot or clone, the snapshot to restore) that does not
/// exist: refused before anything is created.
#[derive(Debug, thiserror::Error)]
pub struct SourceNotFound {
    /// The source's kind.
    pub kind: Kind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for SourceNotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, namespace) = (self.kind, self.namespace.as_str());
        write!(
            f,
            "{} not found: nothing was created",
            object_title(kind, namespace, &self.name)
        )?;
        match kind_names(kind) {
            Some((_, many, noun)) => write!(
                f,
                " (list the {noun} with `vmplane get {many}{}`)",
                namespace_flag(kind, namespace)
            ),
            None => Ok(()),
        }
    }
}

/// Reads a shorthand's source with `Get` before the shorthand creates anything: a source that
/// does not exist is [`SourceNotFound`] (a manifest applied with `apply -f` is not checked:
/// KubeVirt accepts a snapshot, restore or clone of a missing source, which then fails).
async fn require_source(
    c: &mut Clients,
    g: &GlobalArgs,
    kind: Kind,
    name: &str,
) -> anyhow::Result<()> {
    let cli_kind = kind_names(kind).map_or(kind.as_str(), |(one, _, _)| one);
    let object = pb::ObjectRef {
        kind: cli_kind.to_owned(),
        namespace: g.namespace.clone(),
        name: name.to_owned(),
    };
    match read_now(c, object, 0).await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Err(SourceNotFound {
            kind,
            namespace: g.namespace.clone(),
            name: name.to_owned(),
        }
        .into()),
        Err(status) => Err(status_error_about(
            status,
            Some(&About::object(cli_kind, &g.namespace, name)),
        )),
    }
}

/// Applies one generated snapshot/restore/clone manifest (the server runs its saga) and prints
/// `KIND/NAME OUTCOME (STATE)`; a saga that ended `Failed` is the command's error.
async fn apply_saga(
    c: &mut Clients,
    g: &GlobalArgs,
    manifest: serde_json::Value,
) -> anyhow::Result<()> {
    let resp = c
        .objects
        .apply(pb::ApplyRequest {
            manifest: manifest.to_string(),
            namespace: g.namespace.clone(),
            expected_generation: None,
            dry_run: false,
            import: false,
            request_id: uuid::Uuid::now_v7().to_string(),
            expected_resource_version: None,
            // Its status is printed.
            view: pb::ObjectView::Full.into(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let obj = resp.object.unwrap_or_default();
    let doc: serde_json::Value = serde_json::from_str(&obj.json).unwrap_or_default();
    let status = doc.get("status").cloned().unwrap_or_default();
    let failure = print::saga_failure(&status);
    let state = match status.get("phase").and_then(|p| p.as_str()) {
        Some(p) => p.to_owned(),
        None if status.get("complete").and_then(|c| c.as_bool()) == Some(true) => {
            "Complete".to_owned()
        }
        None if failure.is_some() => "Failed".to_owned(),
        None => "InProgress".to_owned(),
    };
    match g.output {
        Some(Output::Json) | Some(Output::Yaml) | Some(Output::Name) => {
            print::object(&mut std::io::stdout().lock(), g.output, &obj)?;
        }
        None | Some(Output::Table | Output::Wide) => println!(
            "{}/{} {} ({state})",
            print::short_kind(&obj.kind),
            obj.name,
            resp.outcome
        ),
    }
    if state == "Failed" || failure.is_some() {
        bail!(
            "{} {}: {}",
            obj.kind,
            obj.name,
            failure.unwrap_or_else(|| "failed".to_owned())
        );
    }
    Ok(())
}

/// `snapshot NAME SNAPSHOT`: a VirtualMachineSnapshot of VM NAME.
pub async fn snapshot(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &crate::cli::SnapshotArgs,
) -> anyhow::Result<()> {
    require_source(c, g, Kind::VirtualMachine, &a.name).await?;
    let manifest = serde_json::json!({
        "apiVersion": "snapshot.kubevirt.io/v1beta1",
        "kind": "VirtualMachineSnapshot",
        "metadata": {"name": a.snapshot, "namespace": g.namespace},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": a.name}},
    });
    apply_saga(c, g, manifest).await
}

/// `restore NAME --snapshot SNAPSHOT [--as NEWNAME]`: a VirtualMachineRestore.
pub async fn restore(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &crate::cli::RestoreArgs,
) -> anyhow::Result<()> {
    require_source(c, g, Kind::VirtualMachineSnapshot, &a.snapshot).await?;
    let target = a.as_name.clone().unwrap_or_else(|| a.name.clone());
    let name = a
        .restore_name
        .clone()
        .unwrap_or_else(|| format!("{target}-restore-{}", name_suffix()));
    let manifest = serde_json::json!({
        "apiVersion": "snapshot.kubevirt.io/v1beta1",
        "kind": "VirtualMachineRestore",
        "metadata": {"name": name, "namespace": g.namespace},
        "spec": {
            "target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": target},
            "virtualMachineSnapshotName": a.snapshot,
        },
    });
    apply_saga(c, g, manifest).await
}

/// `clone NAME NEWNAME`: a VirtualMachineClone of VM NAME into VM NEWNAME.
pub async fn clone_vm(
    c: &mut Clients,
    g: &GlobalArgs,
    a: &crate::cli::CloneArgs,
) -> anyhow::Result<()> {
    require_source(c, g, Kind::VirtualMachine, &a.name).await?;
    let name = a
        .clone_name
        .clone()
        .unwrap_or_else(|| format!("{}-clone-{}", a.new_name, name_suffix()));
    let manifest = serde_json::json!({
        "apiVersion": "clone.kubevirt.io/v1beta1",
        "kind": "VirtualMachineClone",
        "metadata": {"name": name, "namespace": g.namespace},
        "spec": {
            "source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": a.name},
            "target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": a.new_name},
        },
    });
    apply_saga(c, g, manifest).await
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::{About, SourceNotFound, Verb, VmFacts, status_error, status_error_about};
    use vmplane_core::types::Kind;

    fn line(status: Status, about: Option<&About<'_>>) -> String {
        status_error_about(status, about).to_string()
    }

    #[test]
    fn a_hint_follows_the_servers_words_unchanged() {
        let about = About::object("vm", "team-a", "ghost");
        assert_eq!(
            line(
                Status::not_found("VirtualMachine team-a/ghost not found"),
                Some(&about)
            ),
            "not found: VirtualMachine team-a/ghost not found (list the VMs with `vmplane get \
             vms -n team-a`)"
        );
        // Cluster-wide kinds are listed without -n.
        let about = About::object("clusterpreference", "team-a", "p");
        assert_eq!(
            line(
                Status::not_found(
                    "VirtualMachineClusterPreference p: metadata.name: \"p\" not found"
                ),
                Some(&about)
            ),
            "not found: VirtualMachineClusterPreference p: metadata.name: \"p\" not found (list \
             the cluster preferences with `vmplane get clusterpreferences`)"
        );
        // Without an object, no NotFound hint: the command named none.
        assert_eq!(
            status_error(Status::not_found("VirtualMachine a/b not found")).to_string(),
            "not found: VirtualMachine a/b not found"
        );
    }

    #[test]
    fn a_missing_reference_or_revision_is_not_hinted_as_a_missing_object() {
        let about = About::object("vm", "default", "demo");
        let reference = Status::not_found(
            "VirtualMachine default/demo: spec.instancetype.name: \
             virtualmachineinstancetypes.instancetype.kubevirt.io \"big\" not found",
        );
        assert_eq!(
            line(reference.clone(), Some(&about)),
            format!("not found: {}", reference.message())
        );
        for message in [
            "VirtualMachine default/demo: vm/default/demo revision 7 not found",
            "VirtualMachine default/demo not found at revision 7",
        ] {
            let status = crate::status::with_reason(
                Status::not_found(message),
                crate::status::REVISION_NOT_FOUND,
            );
            assert!(
                line(status, Some(&about))
                    .ends_with(" (`vmplane history vm demo -n default` lists its revisions)"),
                "{message}"
            );
        }
        let then = About {
            then: Some("--at-position 3".into()),
            ..about.clone()
        };
        assert!(
            line(
                Status::not_found("VirtualMachine default/demo not found at position 3"),
                Some(&then)
            )
            .ends_with(
                "(list the VMs at that point with `vmplane get vms -n default --at-position 3`)"
            )
        );
    }

    #[test]
    fn a_lifecycle_refusal_names_the_command_to_run_next() {
        use vmplane_core::lifecycle::RunStrategy;
        let verb = |verb, rs, active| About {
            verb: Some(verb),
            vm: Some(VmFacts {
                run_strategy: Some(rs),
                active,
                vmi_failed: Some(false),
            }),
            ..About::object("vm", "ns", "demo")
        };
        assert_eq!(
            line(
                Status::failed_precondition("VirtualMachine ns/demo: VM is already running"),
                Some(&verb(Verb::Start, RunStrategy::Manual, true))
            ),
            "refused: VirtualMachine ns/demo: VM is already running (`vmplane get vm demo -n \
             ns` shows its status; `vmplane restart demo -n ns` restarts it)"
        );
        assert!(
            line(
                Status::failed_precondition("VirtualMachine ns/demo: VM is not running"),
                Some(&verb(Verb::Stop, RunStrategy::Manual, false))
            )
            .ends_with("(`vmplane start demo -n ns` starts it; `vmplane get vm demo -n ns` shows its status)")
        );
        assert!(
            line(
                Status::failed_precondition(
                    "VirtualMachine ns/demo: Halted does not support manual restart requests"
                ),
                Some(&verb(Verb::Restart, RunStrategy::Halted, true))
            )
            .ends_with("(`vmplane get vm demo -n ns` shows its status and run strategy)")
        );
        // Without the VM read, no command is suggested.
        let unread = About {
            verb: Some(Verb::Start),
            ..About::object("vm", "ns", "demo")
        };
        assert!(
            line(
                Status::failed_precondition("VirtualMachine ns/demo: VM is already running"),
                Some(&unread)
            )
            .ends_with("(`vmplane get vm demo -n ns` shows its status and run strategy)")
        );
        // A disabled feature gate, wherever it is met.
        let mut gate = Status::failed_precondition(
            "VirtualMachineSnapshot default/s: Snapshot feature gate is not enabled",
        );
        gate.metadata_mut().insert(
            crate::status::REASONS_KEY,
            "FEATURE_NOT_ENABLED".parse().expect("ascii"),
        );
        assert!(line(gate, None).ends_with("an admin enables one in the KubeVirt configuration)"));
    }

    /// Every refusal core's start, stop and restart make, for every run strategy and VM state
    /// that leads to it: the hint suggests only a command the same VM accepts, by the same
    /// rules (`vmplane_core::aggregate::vm`), and suggests one wherever the VM accepts one.
    #[test]
    fn a_lifecycle_hint_suggests_only_what_the_run_strategy_accepts() {
        use vmplane_core::lifecycle::RunStrategy as R;
        // (verb, run strategy, active VMI, last VMI failed) → the refusal's words, or None when
        // the request is taken: core's rules, written out.
        let refusal = |verb: Verb, rs: R, active: bool, failed: bool| -> Option<String> {
            match verb {
                Verb::Start if active => Some("VM is already running".into()),
                Verb::Start => match rs {
                    R::Always | R::Once => Some(format!(
                        "{} does not support manual start requests",
                        rs.as_str()
                    )),
                    R::RerunOnFailure if failed => {
                        Some("RerunOnFailure does not support starting VM from failed state".into())
                    }
                    _ => None,
                },
                Verb::Stop => match rs {
                    R::Always | R::Once => None,
                    _ if active => None,
                    _ => Some("VM is not running".into()),
                },
                Verb::Restart => match rs {
                    R::Halted => Some("Halted does not support manual restart requests".into()),
                    R::Once => {
                        Some("RunStategy Once does not support manual restart requests".into())
                    }
                    _ if active => None,
                    _ => Some("VM is not running".into()),
                },
            }
        };
        let strategies = [R::Always, R::RerunOnFailure, R::Manual, R::Halted, R::Once];
        let verbs = [Verb::Start, Verb::Stop, Verb::Restart];
        for rs in strategies {
            for active in [false, true] {
                // A VMI that failed has ended: never with an active one.
                for failed in [false, true].into_iter().filter(|f| !(*f && active)) {
                    let facts = VmFacts {
                        run_strategy: Some(rs),
                        active,
                        vmi_failed: Some(failed),
                    };
                    for verb in verbs {
                        // The facts agree with core's rules.
                        assert_eq!(
                            facts.accepts(verb),
                            refusal(verb, rs, active, failed).is_none(),
                            "{verb:?} {rs:?} active={active} failed={failed}"
                        );
                        let Some(words) = refusal(verb, rs, active, failed) else {
                            continue;
                        };
                        let about = About {
                            verb: Some(verb),
                            vm: Some(facts),
                            ..About::object("vm", "ns", "demo")
                        };
                        let said = line(
                            Status::failed_precondition(format!("VirtualMachine ns/demo: {words}")),
                            Some(&about),
                        );
                        let case =
                            format!("{verb:?} {rs:?} active={active} failed={failed}: {said}");
                        let mut suggested = 0;
                        for (command, verb) in [
                            ("`vmplane start demo -n ns`", Verb::Start),
                            ("`vmplane stop demo -n ns`", Verb::Stop),
                            ("`vmplane restart demo -n ns`", Verb::Restart),
                        ] {
                            if said.contains(command) {
                                suggested += 1;
                                assert!(facts.accepts(verb), "suggests a refused command: {case}");
                            }
                        }
                        // A refused start of a running VM names restart when it is taken; any
                        // other refusal names start when it is taken.
                        let helpful = if words == "VM is already running" {
                            facts.accepts(Verb::Restart)
                        } else {
                            facts.accepts(Verb::Start)
                        };
                        assert_eq!(suggested, usize::from(helpful), "{case}");
                        assert!(
                            said.contains("`vmplane get vm demo -n ns` shows its status"),
                            "{case}"
                        );
                    }
                }
            }
        }
        // What was not read is not assumed: a RerunOnFailure VM whose VMI was not read.
        let unknown = VmFacts {
            run_strategy: Some(R::RerunOnFailure),
            active: false,
            vmi_failed: None,
        };
        assert!(!unknown.accepts(Verb::Start));
        assert!(!VmFacts::default().accepts(Verb::Start));
    }

    #[test]
    fn a_refused_token_or_role_says_what_to_check() {
        assert_eq!(
            line(
                Status::unauthenticated("the bearer token is not valid"),
                None
            ),
            "unauthenticated: the bearer token is not valid (check the token given with --token \
             or VMPLANE_TOKEN)"
        );
        // The server's message says it already: once.
        let said = line(
            Status::unauthenticated("no bearer token: pass --token or VMPLANE_TOKEN"),
            None,
        );
        assert_eq!(said.matches("--token").count(), 1, "{said}");
        // vmplane's server names the role to ask for: its words end the line.
        let denied = "principal alice may not read VirtualMachine objects in namespace b: ask \
                      an admin for the view or edit role in namespace b";
        assert!(line(Status::permission_denied(denied), None).ends_with(denied));
        assert!(
            line(Status::permission_denied("denied"), None)
                .ends_with("ask an admin for one, or check --token or VMPLANE_TOKEN)")
        );
        let conflict = Status::new(Code::Aborted, "VirtualMachine d/x: expected generation 1");
        assert!(
            line(conflict, Some(&About::object("vm", "d", "x")))
                .ends_with("(re-read it with `vmplane get vm x -n d`, then retry)")
        );
    }

    #[test]
    fn a_missing_source_says_nothing_was_created() {
        let missing = SourceNotFound {
            kind: Kind::VirtualMachineSnapshot,
            namespace: "default".into(),
            name: "nosnap".into(),
        };
        assert_eq!(
            missing.to_string(),
            "VirtualMachineSnapshot default/nosnap not found: nothing was created (list the \
             snapshots with `vmplane get snapshots -n default`)"
        );
    }
}
