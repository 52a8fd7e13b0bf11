//! Lifecycle as pure functions of a [`VmState`] and the cluster's effective [`Features`]: run
//! strategies, what the reconciler should do ([`desired_action`]), crash-loop backoff,
//! `printableStatus`, conditions and the rendered object; for standalone VMIs,
//! [`vmi_conditions`] and [`vmi_blocked_by`]. Status is never stored; projections call these
//! with the features folded from `cluster/config` ([`Features::from_cluster`]).
//!
//! Feature rules ([`crate::features`]): a VM whose spec requests a disabled feature is never
//! launched ([`DesiredAction::FeatureNotEnabled`]) and shows why; a running VMI is never
//! stopped because a feature it uses was disabled, it only shows a `FeatureMismatch`
//! condition.

use serde::Serialize;
use serde_json::{Value, json};

use crate::aggregate::vm::{Existence, VmState, VmiRun};
use crate::aggregate::vmi::VmiState;
use crate::ctx::Ctx;
use crate::event::VmiPhase;
use crate::features::{self, FeatureUse, Features};
use crate::limits::{CRASH_LOOP_BACKOFF_SECONDS_MAX, CRASH_LOOP_BACKOFF_SECONDS_MIN};
use crate::types::{ObjectMeta, VirtualMachine};

/// KubeVirt's run strategies (WaitAsReceiver is not supported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStrategy {
    /// A VMI must always exist; restarted when it ends.
    Always,
    /// Restarted only when it fails.
    RerunOnFailure,
    /// Only start/stop requests act.
    Manual,
    /// No VMI.
    Halted,
    /// Run once; never restarted.
    Once,
}

impl RunStrategy {
    /// Parses KubeVirt's word.
    pub fn parse(s: &str) -> Option<RunStrategy> {
        Some(match s {
            "Always" => RunStrategy::Always,
            "RerunOnFailure" => RunStrategy::RerunOnFailure,
            "Manual" => RunStrategy::Manual,
            "Halted" => RunStrategy::Halted,
            "Once" => RunStrategy::Once,
            _ => return None,
        })
    }
    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStrategy::Always => "Always",
            RunStrategy::RerunOnFailure => "RerunOnFailure",
            RunStrategy::Manual => "Manual",
            RunStrategy::Halted => "Halted",
            RunStrategy::Once => "Once",
        }
    }
}

/// A VM's run strategy: `runStrategy`, or legacy `running: true` ≡ Always, `false` ≡ Halted.
pub fn run_strategy_of(vm: &VirtualMachine) -> Option<RunStrategy> {
    match (&vm.spec.run_strategy, vm.spec.running) {
        (Some(s), _) => RunStrategy::parse(s),
        (None, Some(true)) => Some(RunStrategy::Always),
        (None, Some(false)) => Some(RunStrategy::Halted),
        (None, None) => None,
    }
}

/// What the reconciler should do for a VM now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DesiredAction {
    /// Nothing to do.
    Nothing,
    /// Create a VMI (then record it with [`crate::aggregate::vm::VmCommand::LaunchVmi`]).
    Launch,
    /// Stop the running VMI.
    Stop {
        /// Which VMI.
        vmi_uid: uuid::Uuid,
    },
    /// Remove the VMI: an ended one (a new one may follow), or one never placed on a node
    /// that a stop or a deletion ends (nothing to shut down).
    Remove {
        /// Which VMI.
        vmi_uid: uuid::Uuid,
    },
    /// A VMI should run but crash-loop backoff holds it until then.
    WaitBackoff {
        /// ms since the epoch.
        until_ms: i64,
    },
    /// A VMI should run but the spec requests a feature the cluster has off: no VMI is
    /// created until it is enabled ([`feature_blockers`] lists every such field).
    FeatureNotEnabled {
        /// The first disabled feature requested.
        feature: &'static str,
    },
}

/// The disabled features the VM's next VMI would request (its current spec expanded with the
/// captured instancetype and preference; the stored spec if that cannot be expanded), with
/// their fields, in field order.
pub fn feature_blockers(s: &VmState, features: &Features) -> Vec<FeatureUse> {
    // Derived once per change of the spec or a capture.
    features.disabled_uses(s.requested().to_vec())
}

/// The disabled features the running (not yet ended) VMI uses, from the spec it was launched
/// with: a feature disabled while the VM runs.
pub fn running_feature_mismatch(s: &VmState, features: &Features) -> Vec<FeatureUse> {
    let Some(v) = s.active_vmi() else {
        return Vec::new();
    };
    features.disabled_uses(v.started.requested.clone())
}

/// What should happen next, per run strategy, requests, backoff (kubevirt.md §4.1) and the
/// cluster's features (never `Launch` while the spec requests a disabled feature; a running
/// VMI is never stopped for that).
pub fn desired_action(s: &VmState, features: &Features, now_ms: i64) -> DesiredAction {
    let vmi = s.run.vmi.as_ref();
    // Deleted, or being deleted (Terminating): its VMI is stopped, then removed.
    if !s.is_live() {
        return match vmi {
            Some(v) if !v.phase.is_final() => stop_or_remove(v),
            Some(v) => DesiredAction::Remove { vmi_uid: v.uid },
            None => DesiredAction::Nothing,
        };
    }
    let Some(rs) = s.run_strategy() else {
        return DesiredAction::Nothing;
    };
    if let Some(v) = vmi {
        if !v.phase.is_final() {
            let stop = rs == RunStrategy::Halted || s.run.stop_requested_for == Some(v.uid);
            return if stop {
                stop_or_remove(v)
            } else {
                DesiredAction::Nothing
            };
        }
        // A VMI that ended after a stop request is removed whatever the strategy: KubeVirt's
        // stop deletes the VMI (`stopVMI`), Manual's included.
        let remove = s.run.restart_requested
            || s.run.stop_requested_for == Some(v.uid)
            || match rs {
                RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Halted => true,
                RunStrategy::Manual => s.run.start_requested,
                RunStrategy::Once => false,
            };
        return if remove {
            DesiredAction::Remove { vmi_uid: v.uid }
        } else {
            DesiredAction::Nothing
        };
    }
    let wants_vmi = match rs {
        RunStrategy::Always => true,
        RunStrategy::Once => s.run.launches == 0 || s.run.start_requested,
        RunStrategy::RerunOnFailure | RunStrategy::Manual => s.run.start_requested,
        RunStrategy::Halted => false,
    };
    if !wants_vmi {
        return DesiredAction::Nothing;
    }
    if let Some(blocker) = feature_blockers(s, features).first() {
        return DesiredAction::FeatureNotEnabled {
            feature: blocker.feature,
        };
    }
    match s.run.backoff_until_ms {
        Some(until) if until > now_ms && rs != RunStrategy::Manual => {
            DesiredAction::WaitBackoff { until_ms: until }
        }
        _ => DesiredAction::Launch,
    }
}

/// How a VMI that has not ended is stopped: one never placed on a node (Pending, or Scheduling
/// and unschedulable) has no domain to shut down and never ran, so it is removed at once
/// rather than recorded as ended (it did not succeed, nor fail); any other is stopped (the
/// guest asked to shut down, its final phase recorded, then removed).
fn stop_or_remove(v: &VmiRun) -> DesiredAction {
    let never_placed =
        v.node.is_none() && matches!(v.phase, VmiPhase::Pending | VmiPhase::Scheduling);
    if never_placed {
        DesiredAction::Remove { vmi_uid: v.uid }
    } else {
        DesiredAction::Stop { vmi_uid: v.uid }
    }
}

/// KubeVirt's crash-loop backoff after `failures` VMIs in a row ended before running:
/// `10 s × failures²` plus a random part of up to half of that, capped at 300 s.
pub fn backoff_delay_ms(failures: u32, ctx: &mut Ctx) -> i64 {
    let base_s =
        CRASH_LOOP_BACKOFF_SECONDS_MIN.saturating_mul(i64::from(failures).saturating_pow(2));
    let base_s = base_s.min(CRASH_LOOP_BACKOFF_SECONDS_MAX);
    let base_ms = base_s * 1000;
    let jitter_ms =
        i64::try_from(ctx.below(u64::try_from(base_ms / 2).unwrap_or(0) + 1)).unwrap_or(0);
    (base_ms + jitter_ms).min(CRASH_LOOP_BACKOFF_SECONDS_MAX * 1000)
}

/// KubeVirt's `printableStatus` values vmplane produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrintableStatus {
    /// No VMI and none expected.
    Stopped,
    /// A VMI is on its way.
    Starting,
    /// The VMI runs.
    Running,
    /// The VMI runs, paused.
    Paused,
    /// The VMI is being stopped.
    Stopping,
    /// The VM is being deleted (`metadata.deletionTimestamp`): its VMI is being stopped.
    Terminating,
    /// Crash-loop backoff.
    CrashLoopBackOff,
    /// The VMI cannot be scheduled.
    ErrorUnschedulable,
    /// None of the above.
    Unknown,
}

impl PrintableStatus {
    /// Every value, in declaration order.
    pub const ALL: [PrintableStatus; 9] = [
        PrintableStatus::Stopped,
        PrintableStatus::Starting,
        PrintableStatus::Running,
        PrintableStatus::Paused,
        PrintableStatus::Stopping,
        PrintableStatus::Terminating,
        PrintableStatus::CrashLoopBackOff,
        PrintableStatus::ErrorUnschedulable,
        PrintableStatus::Unknown,
    ];

    /// KubeVirt's word.
    pub fn as_str(self) -> &'static str {
        match self {
            PrintableStatus::Stopped => "Stopped",
            PrintableStatus::Starting => "Starting",
            PrintableStatus::Running => "Running",
            PrintableStatus::Paused => "Paused",
            PrintableStatus::Stopping => "Stopping",
            PrintableStatus::Terminating => "Terminating",
            PrintableStatus::CrashLoopBackOff => "CrashLoopBackOff",
            PrintableStatus::ErrorUnschedulable => "ErrorUnschedulable",
            PrintableStatus::Unknown => "Unknown",
        }
    }
}

/// `printableStatus`, first match wins in KubeVirt's order (kubevirt.md §4.2).
/// A VM held back by a disabled feature has no VMI and shows `Stopped` (KubeVirt has no
/// printableStatus for it; the `Failure` condition says why).
pub fn printable_status(s: &VmState, features: &Features, now_ms: i64) -> PrintableStatus {
    let vmi = s.run.vmi.as_ref();
    let active = s.active_vmi();
    let action = desired_action(s, features, now_ms);
    // KubeVirt's first check: the VM has a deletionTimestamp (its VMI is still there).
    if s.terminating().is_some() || (s.existence == Existence::Deleted && active.is_some()) {
        return PrintableStatus::Terminating;
    }
    if active.is_some()
        && matches!(
            action,
            DesiredAction::Stop { .. } | DesiredAction::Remove { .. }
        )
    {
        return PrintableStatus::Stopping;
    }
    if let Some(v) = active {
        if v.phase == VmiPhase::Running {
            return if v.paused {
                PrintableStatus::Paused
            } else {
                PrintableStatus::Running
            };
        }
        if matches!(v.phase, VmiPhase::Pending | VmiPhase::Scheduling)
            && v.reason.as_deref() == Some("Unschedulable")
        {
            return PrintableStatus::ErrorUnschedulable;
        }
        if matches!(
            v.phase,
            VmiPhase::Pending | VmiPhase::Scheduling | VmiPhase::Scheduled
        ) {
            return PrintableStatus::Starting;
        }
    }
    if action == DesiredAction::Launch {
        return PrintableStatus::Starting;
    }
    if matches!(action, DesiredAction::WaitBackoff { .. }) {
        return PrintableStatus::CrashLoopBackOff;
    }
    if vmi.is_none() || vmi.is_some_and(|v| v.phase.is_final()) {
        return PrintableStatus::Stopped;
    }
    PrintableStatus::Unknown
}

/// KubeVirt's RestartRequired message.
pub const RESTART_REQUIRED_MESSAGE: &str =
    "a non-live-updatable field was changed in the template spec";

/// Whether the running VMI's spec differs from the VM's current one: the template spec
/// (firmware identity included) or the captured instancetype/preference revision. Compared
/// against the spec of the last start, so an unchanged firmware UUID never raises it.
/// vmplane has no live updates yet, so every template change counts (KubeVirt's `Stage`).
pub fn restart_required(s: &VmState) -> bool {
    s.active_vmi().is_some_and(|v| !runs_current_spec(s, v))
}

/// Whether run `v` started from the VM's current template spec and captured revisions
/// (metadata and run strategy aside): what [`restart_required`] and the observed generation
/// compare.
pub fn runs_current_spec(s: &VmState, v: &VmiRun) -> bool {
    let Some(vm) = &s.vm else { return false };
    v.started.template_spec.as_ref() == vm.vmi_spec()
        && v.started.instancetype == s.instancetype.as_ref().map(|c| c.revision())
        && v.started.preference == s.preference.as_ref().map(|c| c.revision())
}

/// One VM condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Ready`, `RestartRequired`, `Failure`, `Paused`.
    pub kind: &'static str,
    /// `True` / `False`.
    pub status: bool,
    /// Machine reason.
    pub reason: String,
    /// Human message.
    pub message: String,
}

/// `{type, status, reason, message}` as KubeVirt writes it (`status` is `True` / `False`). An
/// empty `reason` or `message` is left out, as KubeVirt's `omitempty` does (a `Ready=True`
/// condition has neither).
impl Serialize for Condition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = serializer.serialize_struct("Condition", 4)?;
        out.serialize_field("type", self.kind)?;
        out.serialize_field("status", if self.status { "True" } else { "False" })?;
        if self.reason.is_empty() {
            out.skip_field("reason")?;
        } else {
            out.serialize_field("reason", &self.reason)?;
        }
        if self.message.is_empty() {
            out.skip_field("message")?;
        } else {
            out.serialize_field("message", &self.message)?;
        }
        out.end()
    }
}

/// KubeVirt's condition reason for a requested feature that is off.
pub const FEATURE_NOT_ENABLED_REASON: &str = "FeatureNotEnabled";
/// vmplane's condition type for a VM whose spec or running VMI uses a disabled feature.
pub const FEATURE_MISMATCH_CONDITION: &str = "FeatureMismatch";
/// The `FeatureMismatch` reason when the running VMI uses a feature disabled since its start.
pub const FEATURE_DISABLED_WHILE_RUNNING_REASON: &str = "FeatureDisabledWhileRunning";

/// A VM's VMI's `Ready` condition, which KubeVirt copies onto the VM (kubevirt.md §4.3): True
/// while the VMI runs, else False with the reason the hypervisor reported (`VMI<Phase>` when
/// none). What `kubectl wait vmi NAME --for condition=Ready` waits for.
pub fn vmi_ready(v: &VmiRun) -> Condition {
    if v.phase == VmiPhase::Running {
        return Condition {
            kind: "Ready",
            status: true,
            reason: String::new(),
            message: String::new(),
        };
    }
    Condition {
        kind: "Ready",
        status: false,
        reason: v
            .reason
            .clone()
            .unwrap_or_else(|| format!("VMI{}", v.phase.as_str())),
        message: v
            .message
            .clone()
            .unwrap_or_else(|| format!("VMI is {}", v.phase.as_str())),
    }
}

/// The VM's conditions (kubevirt.md §4.3), plus the feature conditions: `Failure` /
/// `FeatureNotEnabled` while the VM wants a VMI it cannot get, and `FeatureMismatch` whenever
/// the running VMI (reason `FeatureDisabledWhileRunning`) or, with none running, the spec
/// (reason `FeatureNotEnabled`) uses a disabled feature.
pub fn conditions(s: &VmState, features: &Features, now_ms: i64) -> Vec<Condition> {
    let mut out = Vec::new();
    let ready = match s.run.vmi.as_ref() {
        None => Condition {
            kind: "Ready",
            status: false,
            reason: "VMINotExists".into(),
            message: "VMI does not exist".into(),
        },
        Some(v) => vmi_ready(v),
    };
    out.push(ready);
    if s.active_vmi()
        .is_some_and(|v| v.paused && v.phase == VmiPhase::Running)
    {
        out.push(Condition {
            kind: "Paused",
            status: true,
            reason: "PausedByUser".into(),
            message: "VMI was paused by user".into(),
        });
    }
    if restart_required(s) {
        out.push(Condition {
            kind: "RestartRequired",
            status: true,
            reason: String::new(),
            message: RESTART_REQUIRED_MESSAGE.into(),
        });
    }
    let action = desired_action(s, features, now_ms);
    if let DesiredAction::FeatureNotEnabled { .. } = action {
        out.push(Condition {
            kind: "Failure",
            status: true,
            reason: FEATURE_NOT_ENABLED_REASON.into(),
            message: features::not_enabled_message(&feature_blockers(s, features)),
        });
    }
    let running = running_feature_mismatch(s, features);
    if !running.is_empty() {
        out.push(Condition {
            kind: FEATURE_MISMATCH_CONDITION,
            status: true,
            reason: FEATURE_DISABLED_WHILE_RUNNING_REASON.into(),
            message: format!(
                "{}; the running VMI keeps running but cannot start again until it is enabled",
                features::not_enabled_message(&running)
            ),
        });
    } else if s.is_live() && s.active_vmi().is_none() {
        let blockers = feature_blockers(s, features);
        if !blockers.is_empty() {
            out.push(Condition {
                kind: FEATURE_MISMATCH_CONDITION,
                status: true,
                reason: FEATURE_NOT_ENABLED_REASON.into(),
                message: format!(
                    "{}; the VM cannot start until it is enabled",
                    features::not_enabled_message(&blockers)
                ),
            });
        }
    }
    if let DesiredAction::WaitBackoff { until_ms } = action {
        out.push(Condition {
            kind: "Failure",
            status: true,
            reason: "CrashLoopBackOff".into(),
            message: format!(
                "{} VMI(s) in a row ended before running; next start in {} s",
                s.run.consecutive_failures,
                until_ms.saturating_sub(now_ms).max(0).div_euclid(1000)
            ),
        });
    }
    out
}

/// The VM as `get -o yaml` shows it: the stored object (effective firmware UUID in the spec,
/// row 14) with uid, generation and a derived status. `resourceVersion` (a log position) and
/// `creationTimestamp` are the caller's to add. `None` if the VM does not exist.
pub fn render(s: &VmState, features: &Features, now_ms: i64) -> Option<VirtualMachine> {
    let status = render_status(s, features, now_ms)?;
    let mut vm = render_object(s)?;
    vm.status = Some(status);
    Some(vm)
}

/// The stored part of [`render`]: the VM object with its uid and generation, without a
/// status. It changes only with the object, its uid, its generation or its deletion (a
/// Terminating VM's `metadata.deletionTimestamp`), so a caller that
/// renders many states of one VM (time travel) may serialize it once and add each state's
/// [`render_status`]. `None` if no VM object is stored.
pub fn render_object(s: &VmState) -> Option<VirtualMachine> {
    let mut vm = VirtualMachine::clone(s.vm.as_deref()?);
    vm.metadata = render_metadata(s)?;
    vm.status = None;
    Some(vm)
}

/// The `metadata` of [`render_object`], without copying the rest of the object (to serialize
/// with [`crate::types::VirtualMachineView`]). `None` if no VM object is stored.
pub fn render_metadata(s: &VmState) -> Option<ObjectMeta> {
    let mut meta = s.vm.as_deref()?.metadata.clone();
    meta.uid = s.uid.map(|u| u.to_string());
    meta.generation = i64::try_from(s.generation).ok();
    // A Terminating VM: when its deletion was asked for (the stored object never holds it:
    // `defaults` strips it from every manifest).
    if let Some(at) = s
        .terminating()
        .and_then(|d| crate::aggregate::dataprotection::rfc3339(d.at_ms))
    {
        meta.extra
            .insert("deletionTimestamp".into(), Value::String(at));
    }
    Some(meta)
}

/// The derived `status` of [`render`] (printableStatus, conditions, run strategy, firmware
/// origin, captured revisions, generations, start failures). `None` if the VM does not exist.
pub fn render_status(s: &VmState, features: &Features, now_ms: i64) -> Option<Value> {
    serde_json::to_value(vm_status(s, features, now_ms)?).ok()
}

/// [`render_status`] as a value to serialize: the same JSON, written without building a
/// `serde_json::Value` first (a write's answer serializes it straight into its text).
/// `None` if the VM does not exist.
pub fn vm_status(s: &VmState, features: &Features, now_ms: i64) -> Option<VmStatus> {
    if !s.exists() {
        return None;
    }
    let vmi = s.run.vmi.as_ref();
    Some(VmStatus {
        printable_status: printable_status(s, features, now_ms).as_str(),
        ready: vmi.is_some_and(|v| v.phase == VmiPhase::Running),
        created: s.active_vmi().is_some(),
        run_strategy: s.run_strategy().map(RunStrategy::as_str),
        conditions: conditions(s, features, now_ms),
        firmware_uuid_origin: s.firmware.as_ref().map(|fw| fw.origin.as_str()),
        instancetype_ref: s.instancetype.as_deref().map(CapturedRef::of),
        preference_ref: s.preference.as_deref().map(CapturedRef::of),
        desired_generation: s.generation,
        observed_generation: vmi.map(|v| v.observed_generation),
        start_failure: (s.run.consecutive_failures > 0).then_some(StartFailure {
            consecutive_fail_count: s.run.consecutive_failures,
            retry_after_timestamp: s
                .run
                .backoff_until_ms
                .and_then(crate::aggregate::dataprotection::rfc3339),
        }),
    })
}

/// A VM's derived `status` ([`vm_status`]), its keys in the order KubeVirt's are listed and
/// vmplane's added after them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmStatus {
    /// `Stopped`, `Running`, `Starting`, … ([`printable_status`]).
    pub printable_status: &'static str,
    /// Whether its VMI runs.
    pub ready: bool,
    /// Whether it has an active VMI.
    pub created: bool,
    /// Its run strategy, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<&'static str>,
    /// [`conditions`].
    pub conditions: Vec<Condition>,
    /// Where its firmware UUID came from.
    #[serde(rename = "firmwareUUIDOrigin", skip_serializing_if = "Option::is_none")]
    pub firmware_uuid_origin: Option<&'static str>,
    /// The instancetype revision it captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instancetype_ref: Option<CapturedRef>,
    /// The preference revision it captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference_ref: Option<CapturedRef>,
    /// Its generation.
    pub desired_generation: u64,
    /// The latest generation whose spec its VMI runs, while it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    /// Its VMIs that ended before running, while some did in a row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<StartFailure>,
}

/// `status.instancetypeRef` / `status.preferenceRef`: the captured revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapturedRef {
    /// The instancetype's or preference's name.
    pub name: String,
    /// Its kind (namespaced or cluster).
    pub kind: &'static str,
    /// Its generation when captured.
    pub revision: u64,
}

impl CapturedRef {
    fn of<T>(c: &crate::aggregate::vm::Captured<T>) -> CapturedRef {
        CapturedRef {
            name: c.name.clone(),
            kind: c.kind.as_str(),
            revision: c.source_generation,
        }
    }
}

/// `status.startFailure`: the crash loop's count and when the next start may be tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartFailure {
    /// VMIs in a row that ended before running.
    pub consecutive_fail_count: u32,
    /// When the backoff ends (RFC 3339, as KubeVirt's `metav1.Time`; left out without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<String>,
}

/// The VMI annotation holding the VM generation it stands for
/// ([`crate::aggregate::vm::VmiRun::observed_generation`]).
pub const VM_GENERATION_ANNOTATION: &str = "kubevirt.io/vm-generation";

/// The VM's current VMI as the hypervisor runs it and `get vmi <name>` shows it: named like
/// the VM, with the expanded spec it was launched from (instancetype, preference and
/// defaults applied; the template's spec if it could not be expanded), the template's labels
/// and annotations plus KubeVirt's (`kubevirt.io/vm-generation`, the instancetype and
/// preference names), and a status (`phase`, `nodeName`, `reason`, `message`,
/// `firmwareUUIDOrigin`, the `Ready` condition). `None` when the VM has no VMI. Server fields
/// (resourceVersion, ownerReferences, …) are the caller's.
pub fn render_vmi(s: &VmState) -> Option<crate::types::VirtualMachineInstance> {
    let run = s.run.vmi.as_ref()?;
    let expanded = run
        .started
        .expanded
        .as_ref()
        .and_then(|vm| vm.spec.template.as_ref());
    let stored = s.vm.as_ref().and_then(|vm| vm.spec.template.as_ref());
    let mut metadata = expanded
        .or(stored)
        .and_then(|t| t.metadata.clone())
        .unwrap_or_default();
    metadata.name = Some(s.name.clone());
    metadata.namespace = Some(s.namespace.clone());
    metadata.uid = Some(run.uid.to_string());
    let annotations = metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(
        VM_GENERATION_ANNOTATION.into(),
        json!(run.observed_generation.to_string()),
    );
    let matchers = [
        (&run.started.instancetype, "instancetype-name"),
        (&run.started.preference, "preference-name"),
    ];
    for (captured, what) in matchers {
        if let Some((kind, name, _)) = captured {
            let scope = if kind.namespaced() { "" } else { "cluster-" };
            annotations.insert(format!("kubevirt.io/{scope}{what}"), json!(name));
        }
    }
    let spec = match expanded {
        Some(t) => t.spec.clone(),
        None => run.started.template_spec.clone(),
    };
    let mut status = serde_json::Map::new();
    status.insert("phase".into(), json!(run.phase.as_str()));
    if let Some(node) = &run.node {
        status.insert("nodeName".into(), json!(node));
    }
    if let Some(reason) = &run.reason {
        status.insert("reason".into(), json!(reason));
    }
    if let Some(message) = &run.message {
        status.insert("message".into(), json!(message));
    }
    if let Some(fw) = &s.firmware {
        status.insert("firmwareUUIDOrigin".into(), json!(fw.origin.as_str()));
    }
    status.insert("virtualMachineGeneration".into(), json!(run.vm_generation));
    status.insert("conditions".into(), json!([vmi_ready(run)]));
    Some(crate::types::VirtualMachineInstance {
        api_version: crate::types::Kind::VirtualMachineInstance.api_version(),
        kind: "VirtualMachineInstance".into(),
        metadata,
        spec: spec.unwrap_or_default(),
        status: Some(Value::Object(status)),
        extra: Default::default(),
    })
}

/// The disabled features a standalone VMI requests while it has not been scheduled yet: the
/// reconciler must not run it, and it stays `Pending`. Empty once it was scheduled or ran (a
/// running VMI is never stopped for a feature disabled later).
pub fn vmi_blocked_by(s: &VmiState, features: &Features) -> Vec<FeatureUse> {
    let pending = s.is_live() && s.phase.is_none_or(|p| p == VmiPhase::Pending) && s.node.is_none();
    match (&s.vmi, pending) {
        (Some(vmi), true) => features.disabled_uses(features::vmi_features_requested(vmi)),
        _ => Vec::new(),
    }
}

/// A standalone VMI's feature conditions: `Synchronized=False` / `FeatureNotEnabled` while a
/// requested feature keeps it `Pending` ([`vmi_blocked_by`]); `FeatureMismatch` /
/// `FeatureDisabledWhileRunning` when a feature it runs with was disabled since.
pub fn vmi_conditions(s: &VmiState, features: &Features) -> Vec<Condition> {
    let mut out = Vec::new();
    let blocked = vmi_blocked_by(s, features);
    if !blocked.is_empty() {
        out.push(Condition {
            kind: "Synchronized",
            status: false,
            reason: FEATURE_NOT_ENABLED_REASON.into(),
            message: features::not_enabled_message(&blocked),
        });
        return out;
    }
    let active = s.is_live() && s.phase.is_some_and(|p| !p.is_final());
    if let (Some(vmi), true) = (&s.vmi, active) {
        let running = features.disabled_uses(features::vmi_features_requested(vmi));
        if !running.is_empty() {
            out.push(Condition {
                kind: FEATURE_MISMATCH_CONDITION,
                status: true,
                reason: FEATURE_DISABLED_WHILE_RUNNING_REASON.into(),
                message: format!(
                    "{}; the VMI keeps running",
                    features::not_enabled_message(&running)
                ),
            });
        }
    }
    out
}

/// What an edit of a VM changed, as history and audit summarize it: the parts among `spec`,
/// `labels`, `annotations` and `metadata` (the rest of it) that differ, and a run strategy
/// change spelled out (`edited labels`, `run strategy Halted → Always`, `edited spec; run
/// strategy Manual → Always`). `edited` when nothing it compares differs.
pub fn edit_summary(before: &VirtualMachine, after: &VirtualMachine) -> String {
    fn map_eq(a: &Option<crate::types::JsonMap>, b: &Option<crate::types::JsonMap>) -> bool {
        let empty = crate::types::JsonMap::new();
        a.as_ref().unwrap_or(&empty) == b.as_ref().unwrap_or(&empty)
    }
    let (rs_before, rs_after) = (run_strategy_of(before), run_strategy_of(after));
    let mut spec_before = before.spec.clone();
    let mut spec_after = after.spec.clone();
    for spec in [&mut spec_before, &mut spec_after] {
        spec.running = None;
        spec.run_strategy = None;
    }
    let mut parts = Vec::new();
    if spec_before != spec_after || before.extra != after.extra {
        parts.push("spec");
    }
    if !map_eq(&before.metadata.labels, &after.metadata.labels) {
        parts.push("labels");
    }
    if !map_eq(&before.metadata.annotations, &after.metadata.annotations) {
        parts.push("annotations");
    }
    if before.metadata.extra != after.metadata.extra {
        parts.push("metadata");
    }
    let edited = (!parts.is_empty()).then(|| format!("edited {}", parts.join(", ")));
    let strategy = (rs_before != rs_after).then(|| {
        let word = |rs: Option<RunStrategy>| rs.map_or("none", RunStrategy::as_str);
        format!("run strategy {} → {}", word(rs_before), word(rs_after))
    });
    match (edited, strategy) {
        (Some(e), Some(s)) => format!("{e}; {s}"),
        (Some(e), None) => e,
        (None, Some(s)) => s,
        (None, None) => "edited".to_owned(),
    }
}
