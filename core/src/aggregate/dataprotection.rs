//! What snapshot, restore and clone share: the saga step the gateway runs next ([`Next`],
//! [`SagaDecision`]), the typed views of their specs with KubeVirt's admission rules
//! (every cause with its field path), KubeVirt's condition shape, and the conversions between
//! a VM's captured revisions and event payloads, and the opening of a restore's or clone's
//! `Progress` (`open_saga`).
//!
//! Disk contents are out of scope (semantics §5): these objects cover the control plane's state
//! (spec, identity, instancetype/preference revisions). `volumeRestorePolicy`,
//! `volumeNamePolicy`, `deletionPolicy`, `failureDeadline` and friends are kept as written and
//! not interpreted.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::aggregate::Emitter;
use crate::aggregate::object::{self, ObjectCommand, ObjectState};
use crate::aggregate::vm::{Captured, VmCommand};
use crate::ctx::Ctx;
use crate::decision::{Decision, Outcome};
use crate::error::{Category, Cause, Causes, Rejection, codes};
use crate::event::payload::MacAddressV1;
use crate::event::{Event, RevisionCaptured};
use crate::features::{self, Features};
use crate::jsonpatch::{self, PatchOp};
use crate::limits::{CLONE_FILTERS_MAX, PATCHES_MAX};
use crate::types::{GenericObject, Instancetype, Kind, Manifest, Preference};

/// What the gateway does after appending a saga decision's events to the object's own stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Decide `command` on the VM stream `stream` (`vm::decide` with the target's current
    /// state) and append its events and claims. Then run the saga's `Progress` again with the
    /// target reloaded; if `vm::decide` refuses, or the append fails (a firmware UUID claim held
    /// by another VM, a generation conflict), run `TargetRejected` with the rejection.
    ApplyToTarget {
        /// `vm/<ns>/<name>`.
        stream: String,
        /// The command to decide there.
        command: VmCommand,
    },
    /// Run `Progress` again at `at_ms` (ms since the epoch), or sooner when the target changes.
    RetryAt {
        /// When the pending deadline (WaitGracePeriod) falls.
        at_ms: i64,
    },
    /// Run `Progress` again when the target VM (or the snapshot) changes: nothing will happen
    /// before that.
    WaitForChange,
    /// Finished (succeeded or failed): nothing more to do.
    Done,
}

/// A saga step: the events for the object's own stream, and what the gateway does next.
#[derive(Debug, Clone, PartialEq)]
pub struct SagaDecision {
    /// Events (and claims: none today) for `restore|clone/<ns>/<name>`, appended at the state's
    /// revision. May be empty (`Outcome::Unchanged`) while `next` still asks for work, e.g. a
    /// retry of a step whose target command was not applied yet.
    pub decision: Decision,
    /// The next step.
    pub next: Next,
}

/// A saga step with nothing more to do after `decision`.
pub(crate) fn done(decision: Decision) -> SagaDecision {
    SagaDecision {
        decision,
        next: Next::Done,
    }
}

/// A `{apiGroup, kind, name}` reference as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `kubevirt.io`, `snapshot.kubevirt.io`.
    #[serde(default)]
    pub api_group: Option<String>,
    /// `VirtualMachine`, `VirtualMachineSnapshot`.
    #[serde(default)]
    pub kind: String,
    /// The object's name (same namespace).
    #[serde(default)]
    pub name: String,
}

/// One KubeVirt condition of a snapshot, restore or clone (`{type, status, reason}`; the
/// message is vmplane's detail, absent in KubeVirt's own).
pub(crate) fn condition(kind: &str, status: bool, reason: &str, at_ms: Option<i64>) -> Value {
    let mut c = json!({
        "type": kind,
        "status": if status { "True" } else { "False" },
        "reason": reason,
    });
    if let Some(t) = at_ms.and_then(rfc3339)
        && let Some(m) = c.as_object_mut()
    {
        m.insert("lastTransitionTime".into(), json!(t));
    }
    c
}

/// `2023-11-14T22:13:20Z` (KubeVirt's metav1.Time form).
pub(crate) fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Parses the spec of a stored object into `T`, or one `Invalid` cause at the failing field.
pub(crate) fn spec_view<T: serde::de::DeserializeOwned>(o: &GenericObject) -> Result<T, Rejection> {
    let spec = o.spec.clone().unwrap_or(Value::Object(Default::default()));
    if !spec.is_object() {
        return Err(Rejection::invalid(
            "spec",
            codes::INVALID_VALUE,
            "spec must be a map",
        ));
    }
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        Rejection::invalid(
            if path == "." {
                "spec".to_owned()
            } else {
                format!("spec.{path}")
            },
            codes::INVALID_VALUE,
            e.into_inner().to_string(),
        )
    })
}

/// KubeVirt's snapshot/restore reference check: `apiGroup` present and `group`, `kind` one of
/// `kinds`, name set. Messages are KubeVirt's (`missing apiGroup`, `invalid apiGroup`,
/// `invalid kind`).
pub(crate) fn check_ref(r: &ObjectRef, path: &str, kinds: &[Kind], c: &mut Causes) {
    match r.api_group.as_deref() {
        None | Some("") => c.push(
            Category::Invalid,
            Cause::new(
                format!("{path}.apiGroup"),
                codes::REQUIRED,
                "missing apiGroup",
            ),
        ),
        Some(g) => {
            if !kinds.iter().any(|k| k.group() == g) {
                c.invalid(
                    format!("{path}.apiGroup"),
                    codes::INVALID_VALUE,
                    "invalid apiGroup",
                );
            } else if !kinds.iter().any(|k| k.group() == g && k.as_str() == r.kind) {
                c.invalid(format!("{path}.kind"), codes::INVALID_VALUE, "invalid kind");
            }
        }
    }
    if r.name.is_empty() {
        c.invalid(format!("{path}.name"), codes::REQUIRED, "Required value");
    }
}

/// Parses and checks `spec.patches`: each a JSON object with a supported operation on a path
/// KubeVirt's restore admitter allows.
pub(crate) fn check_patches(patches: &[String], c: &mut Causes) -> Vec<PatchOp> {
    if patches.len() > PATCHES_MAX {
        c.push(
            Category::ResourceExhausted,
            Cause::new(
                "spec.patches",
                codes::TOO_MANY,
                format!("more than {PATCHES_MAX} patches"),
            ),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, text) in patches.iter().enumerate() {
        let field = format!("spec.patches[{i}]");
        match jsonpatch::parse(text) {
            Err(why) => c.invalid(field, codes::PATCH_INVALID, why),
            Ok(p) if !jsonpatch::path_allowed(&p.path) => c.invalid(
                field,
                codes::PATCH_INVALID,
                format!(
                    "patching is valid only for elements under /spec/ only: \"path\": \"{}\"",
                    p.path
                ),
            ),
            Ok(p) => out.push(p),
        }
    }
    out
}

/// Checks a clone's label/annotation filter list with KubeVirt's admitter rules: `!` only
/// first, `*` only last, `!` alone is not a filter.
pub(crate) fn check_filters(filters: Option<&Vec<String>>, path: &str, c: &mut Causes) {
    let Some(filters) = filters else { return };
    if filters.len() > CLONE_FILTERS_MAX {
        c.push(
            Category::ResourceExhausted,
            Cause::new(
                path,
                codes::TOO_MANY,
                format!("more than {CLONE_FILTERS_MAX} filters"),
            ),
        );
        return;
    }
    for (i, f) in filters.iter().enumerate() {
        let field = format!("{path}[{i}]");
        if f.is_empty() {
            c.invalid(field, codes::INVALID_VALUE, "an empty filter is not valid");
            continue;
        }
        if f == "!" {
            c.invalid(
                field,
                codes::INVALID_VALUE,
                "a negation character is not a valid filter",
            );
            continue;
        }
        if f.len() == 1 {
            continue;
        }
        if f[1..].contains('!') {
            c.invalid(
                field.clone(),
                codes::INVALID_VALUE,
                format!("filter {f} is invalid: cannot contain a negation character (!); FilterRules: NegationChar can be only used at the beginning of the filter"),
            );
        }
        if f[..f.len() - 1].contains('*') {
            c.invalid(
                field,
                codes::INVALID_VALUE,
                format!("filter {f} is invalid: cannot contain a wildcard character (*); FilterRules: WildcardChar can be only at the end of the filter"),
            );
        }
    }
}

/// Whether a filter (without its `!`) matches `key`: `*` matches everything, a trailing `*`
/// matches by prefix, anything else matches exactly.
fn filter_matches(filter: &str, key: &str) -> bool {
    match filter.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => filter == key,
    }
}

/// KubeVirt's clone filter (kubevirt.md §3.3, `generateStrStrMapPatches`): no filter list keeps
/// every key; otherwise a key is kept when a plain filter matches it **and no negation
/// filter does** — negations win whatever their position in the list. Keys in `always_keep`
/// are never removed.
pub fn filter_keys(
    map: &crate::types::JsonMap,
    filters: Option<&[String]>,
    always_keep: &[&str],
) -> crate::types::JsonMap {
    let Some(filters) = filters else {
        return map.clone();
    };
    map.iter()
        .filter(|(k, _)| {
            if always_keep.contains(&k.as_str()) {
                return true;
            }
            let included = filters
                .iter()
                .filter(|f| !f.starts_with('!'))
                .any(|f| filter_matches(f, k));
            let negated = filters
                .iter()
                .filter_map(|f| f.strip_prefix('!'))
                .any(|f| filter_matches(f, k));
            included && !negated
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Checks MAC addresses (`newMacAddresses`): six two-digit hex groups separated by `:` or `-`.
pub(crate) fn valid_mac(mac: &str) -> bool {
    let sep = if mac.contains('-') { '-' } else { ':' };
    let parts: Vec<&str> = mac.split(sep).collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A captured instancetype/preference as the payload an event carries.
pub(crate) fn revision_of<T: serde::Serialize>(c: &Captured<T>) -> RevisionCaptured {
    RevisionCaptured {
        kind: c.kind.as_str().to_owned(),
        name: c.name.clone(),
        source_uid: c.source_uid.clone(),
        source_generation: c.source_generation,
        object_json: serde_json::to_string(&c.object).unwrap_or_default(),
    }
}

/// The instancetype an event's captured revision holds (for a `PutVm`).
pub(crate) fn instancetype_of(r: Option<&RevisionCaptured>) -> Option<Instancetype> {
    serde_json::from_str(&r?.object_json).ok()
}

/// The preference an event's captured revision holds (for a `PutVm`).
pub(crate) fn preference_of(r: Option<&RevisionCaptured>) -> Option<Preference> {
    serde_json::from_str(&r?.object_json).ok()
}

/// MACs as payload entries, in interface-name order.
pub(crate) fn macs_payload(macs: &BTreeMap<String, String>) -> Vec<MacAddressV1> {
    macs.iter()
        .map(|(interface, mac)| MacAddressV1 {
            interface: interface.clone(),
            mac: mac.clone(),
        })
        .collect()
}

/// MACs of a payload as a JSON map for status.
pub(crate) fn macs_json(macs: &[MacAddressV1]) -> Value {
    Value::Object(
        macs.iter()
            .map(|m| (m.interface.clone(), json!(m.mac)))
            .collect(),
    )
}

/// Result of checking a command's manifest against the stream: the creation event (first
/// command) or nothing (the object exists with the same spec).
pub(crate) fn admit_manifest(
    state: &ObjectState,
    manifest: Option<&GenericObject>,
    kind: Kind,
    ctx: &mut Ctx,
) -> Result<Option<Event>, Rejection> {
    let Some(m) = manifest else {
        if !state.is_live() {
            return Err(Rejection::not_found(
                "metadata.name",
                codes::NOT_FOUND,
                format!("{kind} \"{}\" not found", state.name),
            ));
        }
        return Ok(None);
    };
    if Kind::from_api(&m.api_version, &m.kind) != Some(kind) {
        return Err(Rejection::invalid(
            "kind",
            codes::UNSUPPORTED_KIND,
            format!("expected {kind}, got {} {}", m.api_version, m.kind),
        ));
    }
    if state.is_live() {
        if m.metadata.name_str() != state.name {
            return Err(Rejection::invalid(
                "metadata.name",
                codes::NAME_MISMATCH,
                format!(
                    "manifest names {kind} {}, the stream holds {}",
                    m.metadata.name_str(),
                    state.name
                ),
            ));
        }
        let stored = state.object.as_ref().and_then(|o| match o {
            Manifest::Object(_, g) => g.spec.clone(),
            _ => None,
        });
        if stored != m.spec {
            return Err(Rejection::invalid(
                "spec",
                codes::SPEC_IMMUTABLE,
                "spec is immutable after creation",
            ));
        }
        return Ok(None);
    }
    let d = object::decide(
        state,
        &ObjectCommand::Create(Box::new(Manifest::Object(kind, Box::new(m.clone())))),
        ctx,
    )?;
    Ok(d.events.into_iter().next())
}

/// The spec of the stored object.
pub(crate) fn stored(state: &ObjectState) -> Option<&GenericObject> {
    match state.object.as_ref()? {
        Manifest::Object(_, g) => Some(g),
        _ => None,
    }
}

/// The namespace of an object stream (`default` when none).
pub(crate) fn namespace_of(state: &ObjectState) -> String {
    state
        .namespace
        .clone()
        .unwrap_or_else(|| crate::defaults::DEFAULT_NAMESPACE.to_owned())
}

/// Deletes the object (allowed whatever the phase and whatever the Snapshot gate says, as in
/// KubeVirt, whose admitters check the gate on create only).
pub(crate) fn delete(
    state: &ObjectState,
    expected_generation: Option<u64>,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    object::decide(state, &ObjectCommand::Delete(expected_generation), ctx)
}

/// The folded state of a saga's stream (restore, clone): what [`open_saga`] needs to know of it.
pub(crate) trait Saga: Clone + Default {
    /// The kind its manifest must be.
    const KIND: Kind;
    /// Its name in failure reasons (`the stored clone has no readable spec`).
    const NAME: &'static str;
    /// Its typed spec.
    type Spec: serde::de::DeserializeOwned;
    /// The object (metadata, stored manifest, liveness).
    fn object(&self) -> &ObjectState;
    /// Succeeded or failed: a `Progress` that creates nothing has nothing left to do.
    fn finished(&self) -> bool;
    /// The stream's `evolve`.
    fn evolve(self, event: &Event) -> Self;
    /// KubeVirt's admission check of a manifest (every cause); the parsed `spec.patches`.
    fn validate(manifest: &GenericObject) -> Result<Vec<PatchOp>, Rejection>;
    /// The saga's `…Failed` event.
    fn failed(reason: String, at_ms: i64) -> Event;

    /// The stored spec, if readable.
    fn stored_spec(&self) -> Option<Self::Spec> {
        spec_view(stored(self.object())?).ok()
    }
}

/// A saga's `Progress` under way: the events so far (the creation, if this step created the
/// object), the outcome they will be recorded with, and the step's time.
pub(crate) struct SagaStep<S> {
    em: Emitter<S>,
    outcome: Outcome,
    now: i64,
}

impl<S: Saga> SagaStep<S> {
    /// The state the events so far lead to.
    pub(crate) fn state(&self) -> &S {
        &self.em.state
    }

    /// The step's time (`ctx.now_ms()` once the object was admitted), for the events' `at_ms`.
    pub(crate) fn now(&self) -> i64 {
        self.now
    }

    /// Records an event.
    pub(crate) fn emit(&mut self, event: Event) {
        self.em.emit(event);
    }

    /// Records the saga's failure at the step's time.
    pub(crate) fn fail(&mut self, reason: impl Into<String>) {
        let failed = S::failed(reason.into(), self.now);
        self.em.emit(failed);
    }

    /// The step's decision, then `next`.
    pub(crate) fn then(self, next: Next) -> SagaDecision {
        SagaDecision {
            decision: self.em.finish(self.outcome),
            next,
        }
    }

    /// The step's decision; nothing more to do.
    pub(crate) fn done(self) -> SagaDecision {
        self.then(Next::Done)
    }

    /// Records the saga's failure and ends the step.
    pub(crate) fn failed(mut self, reason: impl Into<String>) -> SagaDecision {
        self.fail(reason);
        self.done()
    }

    /// Fails the saga because its stored spec cannot be read (or lacks what the saga needs).
    pub(crate) fn unreadable_spec(self) -> SagaDecision {
        self.failed(format!("the stored {} has no readable spec", S::NAME))
    }
}

/// A saga's `TargetRejected` once its plan is recorded (the caller checks that): the saga's
/// `…Failed` event at `ctx.now_ms()`, `Outcome::Recorded`, `Done`, with the reason
/// `<what>: <the rejection>`. A cause's holder (the stream holding a claim) is named only
/// within the saga's own namespace: the saga acts for its requester, who may read that
/// namespace only.
pub(crate) fn target_rejected<S: Saga>(
    state: &S,
    what: &str,
    rejection: &Rejection,
    ctx: &Ctx,
) -> SagaDecision {
    let ns = state.object().namespace.as_deref();
    let reason = format!(
        "{what}: {}",
        rejection.describe_for(|holder| holder.is_some() && holder == ns)
    );
    let step = SagaStep {
        em: Emitter::new(state.clone(), S::evolve),
        outcome: Outcome::Recorded,
        now: ctx.now_ms(),
    };
    step.failed(reason)
}

/// What a saga's `Progress` goes on with once [`open_saga`] has admitted its object: the step
/// (holding the creation event if this `Progress` made one), the parsed `spec.patches` (the
/// manifest's, else the stored object's) and the stored spec.
pub(crate) type OpenSaga<S> = (SagaStep<S>, Vec<PatchOp>, <S as Saga>::Spec);

/// Opens a restore's or clone's `Progress`. Both sagas start every step the same way, so they
/// share it here rather than each keeping a copy that could drift:
///
/// 1. the `Snapshot` feature gate must be enabled;
/// 2. a given manifest must pass the saga's validation (its rejection is returned as is);
/// 3. [`admit_manifest`]: the first `Progress` creates the object, a later one must carry the
///    same spec or none;
/// 4. a step that creates nothing on a finished saga is `Unchanged` and `Done`
///    ([`ControlFlow::Break`]);
/// 5. the creation event, if any, opens the step (`Outcome::Created`, else `Recorded`), whose
///    time is `ctx.now_ms()`;
/// 6. without a manifest the patches come from the stored object: a stored object that no
///    longer validates fails the saga with the rejection's text, and one that is missing, or
///    whose spec cannot be read, fails it with `the stored <saga> has no readable spec` —
///    both recorded in this step's decision, `Done` ([`ControlFlow::Break`]).
///
/// Otherwise the step goes on ([`ControlFlow::Continue`]): [`OpenSaga`].
pub(crate) fn open_saga<S: Saga>(
    state: &S,
    features: &Features,
    manifest: Option<&GenericObject>,
    ctx: &mut Ctx,
) -> Result<ControlFlow<SagaDecision, OpenSaga<S>>, Rejection> {
    features::require_feature(features, features::SNAPSHOT)?;
    let patches = manifest.map(S::validate).transpose()?;
    let created = admit_manifest(state.object(), manifest, S::KIND, ctx)?;
    if created.is_none() && state.finished() {
        return Ok(ControlFlow::Break(done(Decision::unchanged())));
    }
    let mut em = Emitter::new(state.clone(), S::evolve);
    let outcome = match created {
        Some(e) => {
            em.emit(e);
            Outcome::Created
        }
        None => Outcome::Recorded,
    };
    let step = SagaStep {
        em,
        outcome,
        now: ctx.now_ms(),
    };
    let patches = match patches {
        Some(p) => p,
        None => match stored(step.state().object()).map(S::validate) {
            Some(Ok(p)) => p,
            Some(Err(r)) => return Ok(ControlFlow::Break(step.failed(r.to_string()))),
            None => return Ok(ControlFlow::Break(step.unreadable_spec())),
        },
    };
    let Some(spec) = step.state().stored_spec() else {
        return Ok(ControlFlow::Break(step.unreadable_spec()));
    };
    Ok(ControlFlow::Continue((step, patches, spec)))
}
