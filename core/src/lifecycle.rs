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

/// A VM's VMI's `Ready` condition, which KubeVirt copies onto the VM (kubevirt.md §4.3)
/// ([`ready_condition`]).
pub fn vmi_ready(v: &VmiRun) -> Condition {
    ready_condition(v.phase, v.reason.as_deref(), v.message.as_deref())
}

/// A VMI's `Ready` condition from what the reconciler last recorded of it, one rule for a VM's
/// VMI and a standalone one: True while it runs, else False with the reason and message the
/// hypervisor reported (`VMI<Phase>` and `VMI is <Phase>` when none: an unschedulable VMI says
/// `Unschedulable` and which node lacks what). What `kubectl wait vmi NAME --for
/// condition=Ready` waits for.
pub fn ready_condition(phase: VmiPhase, reason: Option<&str>, message: Option<&str>) -> Condition {
    if phase == VmiPhase::Running {
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
        reason: reason.map_or_else(|| format!("VMI{}", phase.as_str()), str::to_owned),
        message: message.map_or_else(|| format!("VMI is {}", phase.as_str()), str::to_owned),
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
                "{} VMI(s) in a row ended before running{}; next start in {} s",
                s.run.consecutive_failures,
                start_failure_cause(s),
                until_ms.saturating_sub(now_ms).max(0).div_euclid(1000)
            ),
        });
    }
    out
}

/// `: <reason>: <message>` of the crash loop's latest failure
/// ([`crate::aggregate::vm::RunState::last_start_failure`]), empty when none was recorded.
fn start_failure_cause(s: &VmState) -> String {
    let Some(cause) = &s.run.last_start_failure else {
        return String::new();
    };
    match (cause.reason.as_deref(), cause.message.as_deref()) {
        (Some(reason), Some(message)) => format!(": {reason}: {message}"),
        (Some(said), None) | (None, Some(said)) => format!(": {said}"),
        (None, None) => String::new(),
    }
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
    let status = vmi_status(
        Observed {
            phase: run.phase,
            node: run.node.as_deref(),
            reason: run.reason.as_deref(),
            message: run.message.as_deref(),
        },
        s.firmware.as_ref().map(|fw| fw.origin),
        Some(run.vm_generation),
        Vec::new(),
    );
    Some(crate::types::VirtualMachineInstance {
        api_version: crate::types::Kind::VirtualMachineInstance.api_version(),
        kind: "VirtualMachineInstance".into(),
        metadata,
        spec: spec.unwrap_or_default(),
        status: Some(status),
        extra: Default::default(),
    })
}

/// What the reconciler last recorded of a VMI, a VM's run or a standalone VMI.
struct Observed<'a> {
    phase: VmiPhase,
    node: Option<&'a str>,
    reason: Option<&'a str>,
    message: Option<&'a str>,
}

/// A VMI's `status`, one rule for a VM's VMI ([`render_vmi`]) and a standalone one
/// ([`standalone_vmi_status`]): `phase`, `nodeName`, `reason` and `message` as last
/// recorded, `firmwareUUIDOrigin`, `virtualMachineGeneration` (a VM's VMI), and `conditions`:
/// [`ready_condition`] first, then `more`.
fn vmi_status(
    observed: Observed<'_>,
    firmware_origin: Option<crate::event::FirmwareOrigin>,
    vm_generation: Option<u64>,
    more: Vec<Condition>,
) -> Value {
    let mut status = serde_json::Map::new();
    status.insert("phase".into(), json!(observed.phase.as_str()));
    if let Some(node) = observed.node {
        status.insert("nodeName".into(), json!(node));
    }
    if let Some(reason) = observed.reason {
        status.insert("reason".into(), json!(reason));
    }
    if let Some(message) = observed.message {
        status.insert("message".into(), json!(message));
    }
    if let Some(origin) = firmware_origin {
        status.insert("firmwareUUIDOrigin".into(), json!(origin.as_str()));
    }
    if let Some(generation) = vm_generation {
        status.insert("virtualMachineGeneration".into(), json!(generation));
    }
    let mut conditions = vec![ready_condition(
        observed.phase,
        observed.reason,
        observed.message,
    )];
    conditions.extend(more);
    status.insert("conditions".into(), json!(conditions));
    Value::Object(status)
}

/// A standalone VMI's `status`, by the rule of a VM's VMI ([`vmi_status`]: phase, node,
/// reason, message, the `Ready` condition), its feature conditions ([`vmi_conditions`]) after
/// `Ready`. `None` when no VMI lives under the name.
pub fn standalone_vmi_status(s: &VmiState, features: &Features) -> Option<Value> {
    if !s.is_live() {
        return None;
    }
    Some(vmi_status(
        Observed {
            phase: s.phase.unwrap_or(VmiPhase::Pending),
            node: s.node.as_deref(),
            reason: s.reason.as_deref(),
            message: s.message.as_deref(),
        },
        s.firmware.as_ref().map(|fw| fw.origin),
        None,
        vmi_conditions(s, features),
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::vm::{self, PutVm, VmCommand, VmiObservation};
    use crate::aggregate::vmi::{self, VmiCommand};
    use crate::types::{Manifest, parse_manifest};

    const VM: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
        "metadata":{"name":"web","namespace":"default"},
        "spec":{"runStrategy":"Always","template":{"spec":{"domain":{"memory":{"guest":"64Mi"},
        "devices":{}}}}}}"#;
    const VMI: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
        "metadata":{"name":"solo","namespace":"default"},
        "spec":{"domain":{"memory":{"guest":"64Mi"},"devices":{}}}}"#;
    const DEFINE_FAILED: &str = "libvirt define of domain \"vmplane_default_web\" failed: \
        domain 'squatter' is already defined with uuid 6695eb01-f6a4-8304-79aa-97f2502e193f";
    const UNSCHEDULABLE: &str =
        "no node has 1 vCPUs and 67108864 bytes of memory free (free: node1: 0 vCPUs, 0 bytes)";

    fn vm_decided(state: VmState, command: VmCommand, ctx: &mut Ctx) -> VmState {
        let decision = vm::decide(&state, &command, ctx).expect("accepted");
        decision.events.iter().fold(state, vm::evolve)
    }

    fn vmi_decided(state: VmiState, command: VmiCommand, ctx: &mut Ctx) -> VmiState {
        let decision = vmi::decide(&state, &command, ctx).expect("accepted");
        decision.events.iter().fold(state, vmi::evolve)
    }

    fn observe_vm(state: VmState, observation: VmiObservation, ctx: &mut Ctx) -> VmState {
        let vmi_uid = state.run.vmi.as_ref().expect("a VMI").uid;
        let command = VmCommand::ObserveVmi {
            vmi_uid,
            observation,
        };
        vm_decided(state, command, ctx)
    }

    fn phase(phase: VmiPhase, reason: &str, message: &str) -> VmiObservation {
        VmiObservation::Phase {
            phase,
            reason: Some(reason.into()),
            message: Some(message.into()),
        }
    }

    /// A VM of runStrategy Always with a launched VMI, not placed yet.
    fn pending(ctx: &mut Ctx) -> VmState {
        let Ok(Manifest::VirtualMachine(manifest)) = parse_manifest(VM.as_bytes()) else {
            panic!("a VM");
        };
        let put = VmCommand::Apply(Box::new(PutVm::new(*manifest)));
        let s = vm_decided(VmState::default(), put, ctx);
        let launch = VmCommand::LaunchVmi {
            features: Features::defaults(),
        };
        vm_decided(s, launch, ctx)
    }

    /// [`pending`], its VMI placed on `node1`.
    fn launched(ctx: &mut Ctx) -> VmState {
        let scheduled = VmiObservation::Scheduled {
            node: "node1".into(),
        };
        observe_vm(pending(ctx), scheduled, ctx)
    }

    fn failure(s: &VmState, now_ms: i64) -> Option<Condition> {
        conditions(s, &Features::defaults(), now_ms)
            .into_iter()
            .find(|c| c.kind == "Failure")
    }

    #[test]
    fn a_crash_loop_s_failure_condition_says_why_the_last_vmi_ended_before_running() {
        let mut ctx = Ctx::at_secs(1_700_000_000, 7);
        let s = launched(&mut ctx);
        let s = observe_vm(
            s,
            phase(VmiPhase::Failed, "DomainDefineFailed", DEFINE_FAILED),
            &mut ctx,
        );
        // The VMI is removed (Always replaces it): the cause outlives it.
        let s = observe_vm(s, VmiObservation::Removed, &mut ctx);
        assert!(s.run.vmi.is_none());
        let until = s.run.backoff_until_ms.expect("a backoff");
        let now = ctx.now_ms();
        let condition = failure(&s, now).expect("a Failure condition");
        assert_eq!(condition.reason, "CrashLoopBackOff");
        assert_eq!(
            condition.message,
            format!(
                "1 VMI(s) in a row ended before running: DomainDefineFailed: {DEFINE_FAILED}; \
                 next start in {} s",
                (until - now) / 1000
            )
        );

        // The next VMI runs: the crash loop, and its cause, are over.
        ctx.advance_secs(400);
        let launch = VmCommand::LaunchVmi {
            features: Features::defaults(),
        };
        let s = vm_decided(s, launch, &mut ctx);
        let running = VmiObservation::Phase {
            phase: VmiPhase::Running,
            reason: None,
            message: None,
        };
        let s = observe_vm(s, running, &mut ctx);
        assert_eq!(s.run.last_start_failure, None);
        assert_eq!(failure(&s, ctx.now_ms()), None);
    }

    #[test]
    fn a_failure_without_reason_or_message_keeps_the_crash_loop_s_words() {
        let mut ctx = Ctx::at_secs(1_700_000_000, 7);
        let s = launched(&mut ctx);
        let failed = VmiObservation::Phase {
            phase: VmiPhase::Failed,
            reason: None,
            message: None,
        };
        let s = observe_vm(s, failed, &mut ctx);
        let s = observe_vm(s, VmiObservation::Removed, &mut ctx);
        let message = failure(&s, ctx.now_ms()).expect("Failure").message;
        assert!(
            message.starts_with("1 VMI(s) in a row ended before running; next start in "),
            "{message}"
        );
    }

    #[test]
    fn a_standalone_vmi_s_status_follows_the_rule_of_a_vm_s_vmi() {
        let mut ctx = Ctx::at_secs(1_700_000_000, 7);
        let Ok(Manifest::VirtualMachineInstance(manifest)) = parse_manifest(VMI.as_bytes()) else {
            panic!("a VMI");
        };
        let solo = vmi_decided(VmiState::default(), VmiCommand::Create(manifest), &mut ctx);
        let unschedulable = phase(VmiPhase::Scheduling, "Unschedulable", UNSCHEDULABLE);
        let solo = vmi_decided(solo, VmiCommand::Observe(unschedulable.clone()), &mut ctx);
        let status = standalone_vmi_status(&solo, &Features::defaults()).expect("live");
        assert_eq!(status["phase"], "Scheduling");
        assert_eq!(status["reason"], "Unschedulable");
        assert_eq!(status["message"], UNSCHEDULABLE);
        assert_eq!(
            status["conditions"],
            json!([{"type": "Ready", "status": "False", "reason": "Unschedulable",
                    "message": UNSCHEDULABLE}])
        );

        // A VM's VMI in the same situation shows the same.
        let vm = pending(&mut ctx);
        let vm = observe_vm(vm, unschedulable, &mut ctx);
        let owned = render_vmi(&vm).and_then(|v| v.status).expect("a VMI");
        for key in ["phase", "reason", "message", "conditions"] {
            assert_eq!(owned[key], status[key], "{key}");
        }

        // A new message is recorded (what it lacks changed), the same one is not.
        let other = "no node has 1 vCPUs and 1 bytes of memory free";
        let again = VmiCommand::Observe(phase(VmiPhase::Scheduling, "Unschedulable", other));
        let moved = vmi_decided(solo.clone(), again, &mut ctx);
        assert_eq!(moved.message.as_deref(), Some(other));
        let same = VmiCommand::Observe(phase(VmiPhase::Scheduling, "Unschedulable", other));
        let decision = vmi::decide(&moved, &same, &mut ctx).expect("accepted");
        assert!(decision.events.is_empty());
    }

    #[test]
    fn a_failed_standalone_vmi_says_why_in_its_status() {
        let mut ctx = Ctx::at_secs(1_700_000_000, 7);
        let Ok(Manifest::VirtualMachineInstance(manifest)) = parse_manifest(VMI.as_bytes()) else {
            panic!("a VMI");
        };
        let solo = vmi_decided(VmiState::default(), VmiCommand::Create(manifest), &mut ctx);
        let scheduled = VmiObservation::Scheduled {
            node: "node1".into(),
        };
        let solo = vmi_decided(solo, VmiCommand::Observe(scheduled), &mut ctx);
        let failed = phase(VmiPhase::Failed, "DomainDefineFailed", DEFINE_FAILED);
        let solo = vmi_decided(solo, VmiCommand::Observe(failed), &mut ctx);
        let status = standalone_vmi_status(&solo, &Features::defaults()).expect("live");
        assert_eq!(status["message"], DEFINE_FAILED);
        assert_eq!(status["conditions"][0]["type"], "Ready");
        assert_eq!(status["conditions"][0]["reason"], "DomainDefineFailed");
        assert_eq!(status["conditions"][0]["message"], DEFINE_FAILED);
    }
}
