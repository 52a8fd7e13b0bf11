//! Cluster feature configuration (semantics.md §6, kubevirt.md §6): which features exist, which
//! are on, and which a VM asks for.
//!
//! ## What this module owns
//!
//! * **The registry** ([`GATES`]): KubeVirt's registered feature gates (as of the reference's
//!   snapshot of `pkg/virt-config/featuregate/active.go`, `inactive.go`), each with its
//!   lifecycle [`Stage`]. Names are KubeVirt's, spelled exactly.
//! * **The configuration** ([`FeatureConfig`]), read from the `KubeVirt` manifest (the one
//!   object of stream `cluster/config`): `spec.configuration.developerConfiguration.featureGates`
//!   / `disabledFeatureGates`, and the **feature configurables**, fields of their own
//!   ([`CONFIGURABLES`]: `spec.configuration.downwardMetrics`, written `{}` (on, KubeVirt's
//!   form), `{enabled: true|false}`, or `Enabled` / `Disabled`).
//! * **Validation** of that configuration ([`validate_config`], called by
//!   [`crate::validate::kubevirt`] on every create/update of the `KubeVirt` kind, so an invalid
//!   configuration appends nothing): a name listed in both lists (or a gate contradicting its
//!   configurable), a list that is not a list of strings, or one over
//!   [`FEATURE_GATES_PER_LIST_MAX`] entries is rejected with its field path; every cause is
//!   collected. Everything else is accepted, as KubeVirt's KubeVirt-CR admitter accepts it (a
//!   CR exported from a real cluster applies unchanged): unknown names and Discontinued gates
//!   are never enabled, and [`config_warnings`] says so for each, as it warns about GA and
//!   Deprecated gates listed.
//! * **The effective state** ([`Features`], [`effective_features`]): for every registered
//!   feature, whether it is on, why ([`Source::Explicit`] / [`Source::Default`]) and its stage.
//! * **What a VM asks for** ([`features_requested`]): each [`FeatureUse`] names the feature and
//!   the field path that requests it.
//! * **The command guard** [`require_feature`] (`Snapshot` gates snapshot, restore and clone).
//! * **Discontinued APIs** ([`check_discontinued`], KubeVirt's `ValidateFeatureGates`): a
//!   Discontinued gate listed in `featureGates` plus a spec that uses its API (`Macvtap`: an
//!   interface's `macvtap`; `Passt`: its `passt`) refuses the VM's creation with the gate's
//!   message.
//!
//! ## Stages and KubeVirt's `IsEnabled`
//!
//! | stage | default | listed in `featureGates` | listed in `disabledFeatureGates` |
//! |---|---|---|---|
//! | Alpha | off | on | off |
//! | Beta | on | on | off |
//! | GA | on | on (no-op) | **on** (no-op: GA cannot be disabled) |
//! | Deprecated | off | on (warning) | off |
//! | Discontinued | off | **off** (accepted, warning) | off (accepted, warning) |
//! | (unknown name) | — | ignored (accepted, warning) | ignored (accepted, warning) |
//!
//! `IsEnabled(name)`: GA → true; Discontinued → false; listed in `featureGates` → true; listed in
//! `disabledFeatureGates` → false; else `stage == Beta`. A configurable, when set, decides its
//! feature (it must not contradict the gate lists). Unknown names are never enabled, and are no
//! feature: [`Features`] (what `vmplane features` lists) holds registered gates only, so a
//! listed Discontinued gate shows as off with source `default` and an unknown name not at all.
//! Which gates a name means is this version's registry: a configuration stored while a name
//! was unknown enables that gate once a later registry knows it, as KubeVirt does on upgrade.
//!
//! ## The rules (applied by [`crate::lifecycle`], all derived, never stored)
//!
//! Status is a pure function of (VM state, [`Features`]):
//! * a VM whose spec requests a disabled feature gets no VMI
//!   ([`crate::lifecycle::DesiredAction::FeatureNotEnabled`] instead of `Launch`, and
//!   `LaunchVmi` is refused) and, while it wants to run, a `Failure` condition with reason
//!   `FeatureNotEnabled` naming the feature and the field;
//! * a stopped VM whose spec requests a disabled feature shows a `FeatureMismatch` condition
//!   (reason `FeatureNotEnabled`);
//! * disabling a feature never rejects the configuration and never stops a running VMI: the VM
//!   shows `FeatureMismatch` with reason `FeatureDisabledWhileRunning`, and once stopped it
//!   cannot start again until the feature is enabled; enabling it clears all of this;
//! * a standalone VMI requesting a disabled feature stays `Pending` with condition
//!   `Synchronized=False`, reason `FeatureNotEnabled` ([`crate::lifecycle::vmi_conditions`]).
//!
//! ## The one KubeVirt object
//!
//! Every `KubeVirt` manifest maps to the single stream `cluster/config`, whose object
//! aggregate refuses a second name (`NAME_MISMATCH`), so at most one configuration exists.
//! vmplane does not insist on KubeVirt's customary `kubevirt/kubevirt` name and namespace.
//! No configuration (never created, or deleted) means every feature at its stage's default.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::{Category, Cause, Causes, Rejection, codes};
use crate::limits::FEATURE_GATES_PER_LIST_MAX;
use crate::types::{
    GenericObject, Kind, Manifest, VirtualMachine, VirtualMachineInstance, VmiSpec,
};

/// A feature's lifecycle stage (KubeVirt's `featuregate.State`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Under experimentation: off unless listed in `featureGates`.
    Alpha,
    /// Under evaluation: on unless listed in `disabledFeatureGates` (since KubeVirt v1.9).
    Beta,
    /// General availability: always on; listing it is a no-op.
    Ga,
    /// Going away: off unless listed in `featureGates` (KubeVirt warns).
    Deprecated,
    /// Removed: never on; listing it is accepted (a warning), but a VM using its API is then
    /// refused ([`check_discontinued`]).
    Discontinued,
}

impl Stage {
    /// The word `vmplane features` prints (`Alpha`, `Beta`, `GA`, `Deprecated`, `Discontinued`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Alpha => "Alpha",
            Stage::Beta => "Beta",
            Stage::Ga => "GA",
            Stage::Deprecated => "Deprecated",
            Stage::Discontinued => "Discontinued",
        }
    }

    /// Whether a feature of this stage is on when the configuration does not mention it.
    pub fn enabled_by_default(self) -> bool {
        matches!(self, Stage::Beta | Stage::Ga)
    }
}

/// One registered feature gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// KubeVirt's name, exactly.
    pub name: &'static str,
    /// Its lifecycle stage.
    pub stage: Stage,
    /// For Deprecated and Discontinued gates: KubeVirt's message (empty otherwise).
    pub message: &'static str,
}

const fn g(name: &'static str, stage: Stage) -> Gate {
    Gate {
        name,
        stage,
        message: "",
    }
}

const fn m(name: &'static str, stage: Stage, message: &'static str) -> Gate {
    Gate {
        name,
        stage,
        message,
    }
}

/// `DownwardMetrics`: host metrics exposed to the guest (Alpha).
pub const DOWNWARD_METRICS: &str = "DownwardMetrics";
/// `Snapshot`: gates snapshot, restore and clone (Beta).
pub const SNAPSHOT: &str = "Snapshot";
/// `VMPersistentState`: persistent TPM and EFI state (GA).
pub const VM_PERSISTENT_STATE: &str = "VMPersistentState";
/// `PersistentReservation`: SCSI persistent reservation on LUN disks (GA).
pub const PERSISTENT_RESERVATION: &str = "PersistentReservation";
/// `HostDevices`: host device passthrough (Alpha).
pub const HOST_DEVICES: &str = "HostDevices";
/// `GPU`: GPU passthrough (GA).
pub const GPU: &str = "GPU";

use Stage::{Alpha, Beta, Deprecated, Discontinued, Ga};

/// KubeVirt's registered gates at the reference's snapshot, by stage (kubevirt.md §6).
pub const GATES: &[Gate] = &[
    // Alpha
    g("CPUManager", Alpha),
    g("ExperimentalIgnitionSupport", Alpha),
    g("HypervStrictCheck", Alpha),
    g("Sidecar", Alpha),
    g(HOST_DEVICES, Alpha),
    g("HostDisk", Alpha),
    g(DOWNWARD_METRICS, Alpha),
    g("Root", Alpha),
    g("WorkloadEncryptionTDX", Alpha),
    g("VSOCK", Alpha),
    g("AlignCPUs", Alpha),
    g("EnableVirtioFsStorageVolumes", Alpha),
    g("PCINUMAAwareTopology", Alpha),
    g("NetworkDevicesWithDRA", Alpha),
    g("ObjectGraph", Alpha),
    g("UtilityVolumes", Alpha),
    g("ConfigurableHypervisor", Alpha),
    g("IncrementalBackup", Alpha),
    g("ContainerPathVolumes", Alpha),
    g("ReservedOverheadMemlock", Alpha),
    g("VGPULiveMigration", Alpha),
    g("VMStatsCollector", Alpha),
    g("OCIExport", Alpha),
    g("Plugins", Alpha),
    g("GraceIOVirtualization", Alpha),
    g("IOMMUFD", Alpha),
    g("FirmwareAutoSelection", Alpha),
    g("MigrationStallDetection", Alpha),
    g("MigrationDowntimeTuning", Alpha),
    g("CrossArchitectureVirtualization", Alpha),
    g("PortRangesSpec", Alpha),
    // Beta
    g("ImageVolume", Beta),
    g(SNAPSHOT, Beta),
    g("WorkloadEncryptionSEV", Beta),
    g("KubevirtSeccompProfile", Beta),
    g("NodeRestriction", Beta),
    g("GPUsWithDRA", Beta),
    g("HostDevicesWithDRA", Beta),
    g("DecentralizedLiveMigration", Beta),
    g("DeclarativeHotplugVolumes", Beta),
    g("PasstBinding", Beta),
    g("PodSecondaryInterfaceNamingUpgrade", Beta),
    g("ExternalNetResourceInjection", Beta),
    g("RebootPolicy", Beta),
    g("Template", Beta),
    g("OptOutRoleAggregation", Beta),
    // GA
    g("LiveMigration", Ga),
    g("SRIOVLiveMigration", Ga),
    g("NonRoot", Ga),
    g("PSA", Ga),
    g("CPUNodeDiscovery", Ga),
    g("NUMA", Ga),
    g("CommonInstancetypesDeploymentGate", Ga),
    g(GPU, Ga),
    g("HotplugNICs", Ga),
    g("BochsDisplayForEFIGuests", Ga),
    g("VMLiveUpdateFeatures", Ga),
    g("NetworkBindingPlugins", Ga),
    g("DynamicPodInterfaceNaming", Ga),
    g("VolumesUpdateStrategy", Ga),
    g("VolumeMigration", Ga),
    g("DisableCustomSELinuxPolicy", Ga),
    g("AutoResourceLimitsGate", Ga),
    g("ClusterProfiler", Ga),
    g(VM_PERSISTENT_STATE, Ga),
    g("VMExport", Ga),
    g(PERSISTENT_RESERVATION, Ga),
    g("InstancetypeReferencePolicy", Ga),
    g("EnableVirtioFsConfigVolumes", Ga),
    g("ExpandDisks", Ga),
    g("PanicDevices", Ga),
    g("LiveUpdateNADRef", Ga),
    g("VideoConfig", Ga),
    g("SecureExecution", Ga),
    g("MigrationPriorityQueue", Ga),
    g("VmiMemoryOverheadReport", Ga),
    g("LibvirtHooksServerAndClient", Ga),
    // Deprecated
    m(
        "DockerSELinuxMCSWorkaround",
        Deprecated,
        "DockerSELinuxMCSWorkaround has been deprecated since v1.4.",
    ),
    m(
        "MultiArchitecture",
        Deprecated,
        "MultiArchitecture has been deprecated since v1.8.0",
    ),
    m(
        "DisableMDEVConfiguration",
        Deprecated,
        "DisableMDEVConfiguration has been deprecated since v1.8.0",
    ),
    m(
        "HotplugVolumes",
        Deprecated,
        "HotplugVolumes has been deprecated since v1.9.0 and has been replaced by DeclarativeHotplugVolumes",
    ),
    // Discontinued
    m(
        "ExperimentalVirtiofsSupport",
        Discontinued,
        "Virtiofs ExperimentalVirtiofsSupport feature gate is discontinued since v1.7. Please use EnableVirtioFsConfigVolumes or EnableVirtioFsPVC feature gates instead",
    ),
    m(
        "Passt",
        Discontinued,
        "Passt network binding is discontinued since v1.3. Please refer to Kubevirt user guide for alternatives.",
    ),
    m(
        "Macvtap",
        Discontinued,
        "Macvtap network binding is discontinued since v1.3. Please refer to Kubevirt user guide for alternatives.",
    ),
    m(
        "PasstIPStackMigration",
        Discontinued,
        "Seamless migration with passt network binding plugin is no longer supported since KubeVirt v1.8. Please use the passt core binding instead.",
    ),
];

/// The registered gate called `name` (exact, case-sensitive, as KubeVirt).
pub fn gate(name: &str) -> Option<&'static Gate> {
    GATES.iter().find(|g| g.name == name)
}

/// Where the developer configuration lives in a `KubeVirt` manifest.
pub const DEVELOPER_CONFIGURATION_PATH: &str = "spec.configuration.developerConfiguration";

/// A feature configurable: a field of its own under `spec.configuration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Configurable {
    /// The feature it switches.
    pub feature: &'static str,
    /// Its key under `spec.configuration`.
    pub key: &'static str,
}

/// The feature configurables vmplane accepts (semantics.md §6; KubeVirt's "feature
/// configurables" proposal names DownwardMetrics as its example; shipped KubeVirt has none).
pub const CONFIGURABLES: &[Configurable] = &[Configurable {
    feature: DOWNWARD_METRICS,
    key: "downwardMetrics",
}];

/// The gate lists and configurables of a cluster configuration, as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureConfig {
    /// `featureGates`, in order (entries that are not strings are skipped).
    pub feature_gates: Vec<String>,
    /// `disabledFeatureGates`, in order.
    pub disabled_feature_gates: Vec<String>,
    /// Configurables that are set: (feature, on).
    pub configurables: Vec<(&'static str, bool)>,
}

fn configuration(spec: &Value) -> Option<&Value> {
    spec.get("configuration")
}

fn developer_list<'a>(spec: &'a Value, key: &str) -> Option<&'a Value> {
    configuration(spec)?.get("developerConfiguration")?.get(key)
}

/// The value of a configurable: `{}` and `Enabled` are on, `Disabled` is off,
/// `{enabled: bool}` is that; null means unset. `Err` for any other shape.
fn configurable_value(v: &Value) -> Result<Option<bool>, ()> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "Enabled" => Ok(Some(true)),
        Value::String(s) if s == "Disabled" => Ok(Some(false)),
        Value::Object(o) if o.is_empty() => Ok(Some(true)),
        Value::Object(o) if o.len() == 1 => match o.get("enabled") {
            Some(Value::Bool(b)) => Ok(Some(*b)),
            _ => Err(()),
        },
        _ => Err(()),
    }
}

impl FeatureConfig {
    /// Reads the configuration of a `KubeVirt` object. Total: shapes it cannot read are left
    /// out ([`validate_config`] reports them).
    pub fn from_kubevirt(o: &GenericObject) -> FeatureConfig {
        o.spec.as_ref().map(Self::from_spec).unwrap_or_default()
    }

    /// Reads the configuration from a `KubeVirt` `spec`.
    pub fn from_spec(spec: &Value) -> FeatureConfig {
        let list = |key: &str| -> Vec<String> {
            developer_list(spec, key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let configurables = CONFIGURABLES
            .iter()
            .filter_map(|c| {
                let v = configuration(spec)?.get(c.key)?;
                Some((c.feature, configurable_value(v).ok()??))
            })
            .collect();
        FeatureConfig {
            feature_gates: list("featureGates"),
            disabled_feature_gates: list("disabledFeatureGates"),
            configurables,
        }
    }

    /// KubeVirt's `IsEnabled(name)` for this configuration, with why.
    pub fn decide(&self, name: &str) -> (bool, Source) {
        let Some(gate) = gate(name) else {
            return (false, Source::Default);
        };
        match gate.stage {
            Stage::Ga => return (true, Source::Default),
            Stage::Discontinued => return (false, Source::Default),
            _ => {}
        }
        if let Some((_, on)) = self.configurables.iter().find(|(f, _)| *f == name) {
            return (*on, Source::Explicit);
        }
        if self.feature_gates.iter().any(|g| g == name) {
            return (true, Source::Explicit);
        }
        if self.disabled_feature_gates.iter().any(|g| g == name) {
            return (false, Source::Explicit);
        }
        (gate.stage.enabled_by_default(), Source::Default)
    }
}

/// Why a feature is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The cluster configuration decided it (a gate list or a configurable).
    Explicit,
    /// Its stage's default (GA and Discontinued gates are always this: listing them changes
    /// nothing).
    Default,
}

impl Source {
    /// `explicit` / `default`, as `vmplane features` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Explicit => "explicit",
            Source::Default => "default",
        }
    }
}

/// One feature's effective state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureStatus {
    /// The gate's name.
    pub name: &'static str,
    /// Whether it is on.
    pub enabled: bool,
    /// Why.
    pub source: Source,
    /// Its lifecycle stage.
    pub stage: Stage,
}

/// The effective state of every registered feature: what lifecycle rules and the
/// snapshot/restore/clone commands take as input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    statuses: Vec<FeatureStatus>,
    /// The Discontinued gates listed in `featureGates` (never enabled; a VM using their API is
    /// refused at creation: [`discontinued_uses`]).
    listed_discontinued: Vec<&'static str>,
}

impl Features {
    /// The effective features of a configuration (`None`: no `KubeVirt` object, every feature
    /// at its default).
    pub fn from_config(config: Option<&GenericObject>) -> Features {
        let config = config.map(FeatureConfig::from_kubevirt).unwrap_or_default();
        Self::from_feature_config(&config)
    }

    /// The effective features of a parsed configuration.
    pub fn from_feature_config(config: &FeatureConfig) -> Features {
        let statuses = GATES
            .iter()
            .map(|gate| {
                let (enabled, source) = config.decide(gate.name);
                FeatureStatus {
                    name: gate.name,
                    enabled,
                    source,
                    stage: gate.stage,
                }
            })
            .collect();
        let listed_discontinued = GATES
            .iter()
            .filter(|g| g.stage == Stage::Discontinued)
            .filter(|g| config.feature_gates.iter().any(|n| n == g.name))
            .map(|g| g.name)
            .collect();
        Features {
            statuses,
            listed_discontinued,
        }
    }

    /// The effective features of the folded `cluster/config` stream (defaults when the
    /// configuration does not exist or was deleted).
    pub fn from_cluster(state: &crate::aggregate::object::ObjectState) -> Features {
        match state.object.as_ref() {
            Some(Manifest::Object(Kind::KubeVirt, o)) if state.is_live() => {
                Self::from_config(Some(o))
            }
            _ => Self::defaults(),
        }
    }

    /// Every feature at its stage's default (no `KubeVirt` object).
    pub fn defaults() -> Features {
        Self::from_feature_config(&FeatureConfig::default())
    }

    /// The defaults with these gates listed in `featureGates` (tests, examples).
    pub fn with_enabled(names: &[&str]) -> Features {
        Self::from_feature_config(&FeatureConfig {
            feature_gates: names.iter().map(|s| (*s).to_owned()).collect(),
            ..FeatureConfig::default()
        })
    }

    /// The defaults with these gates listed in `disabledFeatureGates`.
    pub fn with_disabled(names: &[&str]) -> Features {
        Self::from_feature_config(&FeatureConfig {
            disabled_feature_gates: names.iter().map(|s| (*s).to_owned()).collect(),
            ..FeatureConfig::default()
        })
    }

    /// Whether `name` is on (unknown names never are).
    pub fn is_enabled(&self, name: &str) -> bool {
        self.status(name).is_some_and(|s| s.enabled)
    }

    /// The state of `name`, if it is a registered gate.
    pub fn status(&self, name: &str) -> Option<&FeatureStatus> {
        self.statuses.iter().find(|s| s.name == name)
    }

    /// Every feature, in registry order.
    pub fn statuses(&self) -> &[FeatureStatus] {
        &self.statuses
    }

    /// The Discontinued gates the configuration lists in `featureGates`, in registry order.
    pub fn listed_discontinued(&self) -> &[&'static str] {
        &self.listed_discontinued
    }

    /// The requested features that are off, in request order.
    pub fn disabled_uses(&self, uses: Vec<FeatureUse>) -> Vec<FeatureUse> {
        uses.into_iter()
            .filter(|u| !self.is_enabled(u.feature))
            .collect()
    }
}

/// What `vmplane features` lists: every registered feature's effective state, in registry
/// order (`usedBy` is the projections' to add).
pub fn effective_features(config: Option<&GenericObject>) -> Vec<FeatureStatus> {
    Features::from_config(config).statuses
}

/// Validates the feature part of a `KubeVirt` object, adding every problem to `c`.
pub fn validate_config(o: &GenericObject, c: &mut Causes) {
    let Some(spec) = o.spec.as_ref() else { return };
    let mut lists: [(&str, Vec<(usize, &str)>); 2] = [
        ("featureGates", Vec::new()),
        ("disabledFeatureGates", Vec::new()),
    ];
    for (key, names) in &mut lists {
        let path = format!("{DEVELOPER_CONFIGURATION_PATH}.{key}");
        let Some(v) = developer_list(spec, key) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        let Some(items) = v.as_array() else {
            c.invalid(
                path,
                codes::INVALID_VALUE,
                "must be a list of feature gate names",
            );
            continue;
        };
        if items.len() > FEATURE_GATES_PER_LIST_MAX {
            c.invalid(
                path,
                codes::TOO_MANY,
                format!(
                    "Too many: {}: must have at most {FEATURE_GATES_PER_LIST_MAX} items",
                    items.len()
                ),
            );
            continue;
        }
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let Some(name) = item.as_str() else {
                c.invalid(
                    at,
                    codes::INVALID_VALUE,
                    "must be a feature gate name (a string)",
                );
                continue;
            };
            // Unknown and Discontinued names are accepted (KubeVirt only warns:
            // `config_warnings`) and never enabled (`FeatureConfig::decide`); a name in both
            // lists is refused whatever it names.
            names.push((i, name));
        }
    }
    let [(_, enabled), (_, disabled)] = &lists;
    let mut reported = BTreeSet::new();
    for (i, name) in enabled {
        if let Some((j, _)) = disabled.iter().find(|(_, d)| d == name)
            && reported.insert(*name)
        {
            c.invalid(
                format!("{DEVELOPER_CONFIGURATION_PATH}.featureGates[{i}]"),
                codes::FEATURE_GATE_CONFLICT,
                format!(
                    "feature gate {name} is listed in both featureGates and disabledFeatureGates[{j}]; a gate must appear in at most one of them"
                ),
            );
        }
    }
    let Some(conf) = configuration(spec) else {
        return;
    };
    for cfg in CONFIGURABLES {
        let Some(v) = conf.get(cfg.key) else { continue };
        let path = format!("spec.configuration.{}", cfg.key);
        match configurable_value(v) {
            Err(()) => c.invalid(
                path,
                codes::INVALID_VALUE,
                "must be {} (enabled), {enabled: true|false}, \"Enabled\" or \"Disabled\"",
            ),
            Ok(None) => {}
            Ok(Some(on)) => {
                let (list, contradicts) = if on {
                    ("disabledFeatureGates", disabled)
                } else {
                    ("featureGates", enabled)
                };
                if contradicts.iter().any(|(_, n)| *n == cfg.feature) {
                    c.invalid(
                        path,
                        codes::FEATURE_GATE_CONFLICT,
                        format!(
                            "{} is {} here but listed in {DEVELOPER_CONFIGURATION_PATH}.{list}",
                            cfg.feature,
                            if on { "enabled" } else { "disabled" }
                        ),
                    );
                }
            }
        }
    }
}

/// The warnings for an accepted configuration, each cause naming its list entry (KubeVirt's
/// KubeVirt-CR admitter warns and never refuses for these):
/// * a name no registered gate has (code [`codes::FEATURE_GATE_UNKNOWN`]): ignored, never
///   enabled; when it is a registered name written in another case, the warning says which;
/// * a Discontinued gate ([`codes::FEATURE_GATE_DISCONTINUED`]): never enabled, listing it has
///   no effect; the gate's own message says what replaced it;
/// * a GA gate (listing it is redundant) and a Deprecated one (KubeVirt's message), code
///   [`codes::FEATURE_GATE_REDUNDANT`].
///
/// Entries that are not strings are [`validate_config`]'s (a rejection, not a warning).
pub fn config_warnings(o: &GenericObject) -> Vec<Cause> {
    let Some(spec) = o.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for key in ["featureGates", "disabledFeatureGates"] {
        let Some(items) = developer_list(spec, key).and_then(Value::as_array) else {
            continue;
        };
        for (i, item) in items.iter().enumerate() {
            let Some(name) = item.as_str() else { continue };
            let (code, reason) = match gate(name) {
                None => (codes::FEATURE_GATE_UNKNOWN, unknown_gate_reason(name)),
                Some(g) => match g.stage {
                    Stage::Discontinued => (
                        codes::FEATURE_GATE_DISCONTINUED,
                        format!(
                            "feature gate {name} is discontinued and never enabled; listing it in {key} has no effect: {}",
                            g.message
                        ),
                    ),
                    Stage::Ga => (
                        codes::FEATURE_GATE_REDUNDANT,
                        format!(
                            "feature gate {name} is GA and always enabled; listing it in {key} has no effect"
                        ),
                    ),
                    Stage::Deprecated => (codes::FEATURE_GATE_REDUNDANT, g.message.to_owned()),
                    Stage::Alpha | Stage::Beta => continue,
                },
            };
            out.push(Cause::new(
                format!("{DEVELOPER_CONFIGURATION_PATH}.{key}[{i}]"),
                code,
                reason,
            ));
        }
    }
    out
}

/// The warning for a listed name no registered gate has.
fn unknown_gate_reason(name: &str) -> String {
    let mut reason = format!("unknown feature gate {name:?}: ignored (never enabled)");
    if let Some(g) = GATES.iter().find(|g| g.name.eq_ignore_ascii_case(name)) {
        reason.push_str(&format!(
            "; names are case-sensitive: did you mean {:?}?",
            g.name
        ));
    }
    reason
}

/// One feature a spec asks for, and the field that asks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FeatureUse {
    /// The gate's name.
    pub feature: &'static str,
    /// The requesting field's path, e.g. `spec.template.spec.domain.devices.downwardMetrics`.
    pub field: String,
}

fn present(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

fn non_empty_list(v: Option<&Value>) -> bool {
    v.and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// The features a VMI spec requests, each with the field (under `prefix`, e.g.
/// `spec.template.spec` for a VM, `spec` for a VMI), in field order:
/// * `DownwardMetrics`: `domain.devices.downwardMetrics`, or a volume with `downwardMetrics`;
/// * `VMPersistentState`: `domain.devices.tpm.persistent: true`,
///   `domain.firmware.bootloader.efi.persistent: true`;
/// * `PersistentReservation`: `domain.devices.disks[i].lun.reservation: true`;
/// * `HostDevices`: a non-empty `domain.devices.hostDevices`;
/// * `GPU`: a non-empty `domain.devices.gpus`.
///
/// `Snapshot` is never requested by a spec: it gates commands ([`require_feature`]).
pub fn features_requested(spec: &VmiSpec, prefix: &str) -> Vec<FeatureUse> {
    // Read from the typed spec and the unknown fields it keeps (the fields below are all
    // unknown to the types but `hostDevices` and `gpus`): no JSON tree of the spec is built.
    // The test below holds this equal to reading the same paths in the spec's JSON.
    let at = |rest: &str| format!("{prefix}.{rest}");
    let mut out = Vec::new();
    let mut push = |feature: &'static str, field: String| out.push(FeatureUse { feature, field });
    let devices = spec.domain.devices.as_ref();
    let dev = |k: &str| devices.and_then(|d| d.extra.get(k));
    if present(dev("downwardMetrics")) {
        push(DOWNWARD_METRICS, at("domain.devices.downwardMetrics"));
    }
    if dev("tpm").and_then(|t| t.get("persistent")) == Some(&Value::Bool(true)) {
        push(VM_PERSISTENT_STATE, at("domain.devices.tpm.persistent"));
    }
    let efi_persistent = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.get("efi"))
        .and_then(|efi| efi.get("persistent"));
    if efi_persistent == Some(&Value::Bool(true)) {
        push(
            VM_PERSISTENT_STATE,
            at("domain.firmware.bootloader.efi.persistent"),
        );
    }
    if let Some(disks) = devices.and_then(|d| d.disks.as_ref()) {
        for (i, d) in disks.iter().enumerate() {
            let reservation = d.lun.as_ref().and_then(|l| l.extra.get("reservation"));
            if reservation == Some(&Value::Bool(true)) {
                push(
                    PERSISTENT_RESERVATION,
                    at(&format!("domain.devices.disks[{i}].lun.reservation")),
                );
            }
        }
    }
    if non_empty_list(devices.and_then(|d| d.host_devices.as_ref())) {
        push(HOST_DEVICES, at("domain.devices.hostDevices"));
    }
    if non_empty_list(devices.and_then(|d| d.gpus.as_ref())) {
        push(GPU, at("domain.devices.gpus"));
    }
    if let Some(volumes) = &spec.volumes {
        for (i, vol) in volumes.iter().enumerate() {
            if present(vol.extra.get("downwardMetrics")) {
                push(
                    DOWNWARD_METRICS,
                    at(&format!("volumes[{i}].downwardMetrics")),
                );
            }
        }
    }
    out
}

/// The features a VM's template requests (fields under `spec.template.spec`).
pub fn vm_features_requested(vm: &VirtualMachine) -> Vec<FeatureUse> {
    vm.vmi_spec()
        .map(template_features_requested)
        .unwrap_or_default()
}

/// The features a VM's template spec requests (fields under `spec.template.spec`).
pub fn template_features_requested(spec: &VmiSpec) -> Vec<FeatureUse> {
    features_requested(spec, "spec.template.spec")
}

/// The features a standalone VMI requests (fields under `spec`).
pub fn vmi_features_requested(vmi: &VirtualMachineInstance) -> Vec<FeatureUse> {
    features_requested(&vmi.spec, "spec")
}

/// The Discontinued gates whose API a VMI spec uses (KubeVirt's `VmiSpecUsed` of each:
/// `Macvtap`, an interface's `macvtap` binding; `Passt`, an interface's `passt` binding), each
/// with the field (under `prefix`), in field order. The other Discontinued gates have no API
/// in a spec.
pub fn discontinued_api_uses(spec: &VmiSpec, prefix: &str) -> Vec<FeatureUse> {
    let mut out = Vec::new();
    let interfaces = spec
        .domain
        .devices
        .as_ref()
        .and_then(|d| d.interfaces.as_deref())
        .unwrap_or_default();
    for (i, iface) in interfaces.iter().enumerate() {
        for (feature, binding) in [("Macvtap", "macvtap"), ("Passt", "passt")] {
            if present(iface.extra.get(binding)) {
                out.push(FeatureUse {
                    feature,
                    field: format!("{prefix}.domain.devices.interfaces[{i}].{binding}"),
                });
            }
        }
    }
    out
}

/// KubeVirt's `ValidateFeatureGates` (kubevirt.md §6, run by its VM admitter on CREATE and its
/// VMI admitter): a Discontinued gate still listed in `featureGates` whose API the spec uses
/// refuses the request, with the gate's message, at the field that uses it. A gate that is
/// not listed refuses nothing here. `prefix` is `spec.template.spec` for a VM, `spec` for a
/// VMI.
pub fn check_discontinued(
    features: &Features,
    spec: &VmiSpec,
    prefix: &str,
) -> Result<(), Rejection> {
    let mut c = Causes::new();
    for u in discontinued_api_uses(spec, prefix) {
        if !features.listed_discontinued.contains(&u.feature) {
            continue;
        }
        let message = gate(u.feature).map_or("", |g| g.message);
        c.invalid(u.field, codes::FEATURE_GATE_DISCONTINUED, message);
    }
    c.finish()
}

/// [`check_discontinued`] for a VM's template (what KubeVirt's VM admitter runs on CREATE).
pub fn check_vm_discontinued(features: &Features, vm: &VirtualMachine) -> Result<(), Rejection> {
    match vm.vmi_spec() {
        Some(spec) => check_discontinued(features, spec, "spec.template.spec"),
        None => Ok(()),
    }
}

/// The message of a `FeatureNotEnabled` condition (KubeVirt's "feature configurables"
/// wording, plus the fields).
pub fn not_enabled_message(uses: &[FeatureUse]) -> String {
    let parts: Vec<String> = uses
        .iter()
        .map(|u| format!("{} (field {})", u.feature, u.field))
        .collect();
    format!(
        "virtual machine is requesting the disabled feature: {}",
        parts.join(", ")
    )
}

/// `Ok` if `feature` is on, else `FailedPrecondition` with code `FEATURE_NOT_ENABLED`
/// (KubeVirt's admitters: "snapshot feature gate not enabled"). The snapshot, restore and
/// clone commands call it with [`SNAPSHOT`].
pub fn require_feature(features: &Features, feature: &str) -> Result<(), Rejection> {
    if features.is_enabled(feature) {
        return Ok(());
    }
    Err(Rejection::one(
        Category::FailedPrecondition,
        Cause::new(
            "",
            codes::FEATURE_NOT_ENABLED,
            format!("{feature} feature gate is not enabled"),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Manifest, parse_manifests};

    /// The same paths read in the spec's JSON, as `features_requested` once did.
    fn by_json(spec: &VmiSpec, prefix: &str) -> Vec<FeatureUse> {
        let v = serde_json::to_value(spec).unwrap_or(Value::Null);
        let at = |rest: &str| format!("{prefix}.{rest}");
        let mut out = Vec::new();
        let mut push =
            |feature: &'static str, field: String| out.push(FeatureUse { feature, field });
        let devices = v.pointer("/domain/devices");
        let dev = |k: &str| devices.and_then(|d| d.get(k));
        if present(dev("downwardMetrics")) {
            push(DOWNWARD_METRICS, at("domain.devices.downwardMetrics"));
        }
        if dev("tpm").and_then(|t| t.get("persistent")) == Some(&Value::Bool(true)) {
            push(VM_PERSISTENT_STATE, at("domain.devices.tpm.persistent"));
        }
        if v.pointer("/domain/firmware/bootloader/efi/persistent") == Some(&Value::Bool(true)) {
            push(
                VM_PERSISTENT_STATE,
                at("domain.firmware.bootloader.efi.persistent"),
            );
        }
        if let Some(disks) = dev("disks").and_then(Value::as_array) {
            for (i, d) in disks.iter().enumerate() {
                if d.pointer("/lun/reservation") == Some(&Value::Bool(true)) {
                    push(
                        PERSISTENT_RESERVATION,
                        at(&format!("domain.devices.disks[{i}].lun.reservation")),
                    );
                }
            }
        }
        if non_empty_list(dev("hostDevices")) {
            push(HOST_DEVICES, at("domain.devices.hostDevices"));
        }
        if non_empty_list(dev("gpus")) {
            push(GPU, at("domain.devices.gpus"));
        }
        if let Some(volumes) = v.get("volumes").and_then(Value::as_array) {
            for (i, vol) in volumes.iter().enumerate() {
                if present(vol.get("downwardMetrics")) {
                    push(
                        DOWNWARD_METRICS,
                        at(&format!("volumes[{i}].downwardMetrics")),
                    );
                }
            }
        }
        out
    }

    fn specs_of(manifests: Vec<Manifest>) -> Vec<VmiSpec> {
        manifests
            .into_iter()
            .filter_map(|m| match m {
                Manifest::VirtualMachine(vm) => vm.vmi_spec().cloned(),
                Manifest::VirtualMachineInstance(vmi) => Some(vmi.spec.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn typed_reading_matches_the_json_paths() {
        let mut specs = Vec::new();
        let corpus =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/manifest");
        let mut files: Vec<_> = std::fs::read_dir(&corpus)
            .expect("the fuzz corpus of manifests")
            .map(|e| e.expect("a corpus entry").path())
            .collect();
        files.sort();
        for file in files {
            let bytes = std::fs::read(&file).expect("a corpus file");
            if let Ok(manifests) = parse_manifests(&bytes) {
                specs.extend(specs_of(manifests));
            }
        }
        assert!(specs.len() >= 10, "the corpus holds VMs and VMIs");
        // Values at the edges: nulls, wrong types, empty lists, false flags.
        let edges = [
            r#"{"domain":{"devices":{"downwardMetrics":null,"tpm":{"persistent":false},"gpus":null,"hostDevices":{}}},"volumes":[{"name":"a","downwardMetrics":null}]}"#,
            r#"{"domain":{"devices":{"downwardMetrics":{},"tpm":{"persistent":"true"},"gpus":[],"hostDevices":[{"name":"x"}],"disks":[{"name":"a","lun":{"reservation":false}},{"name":"b","disk":{"reservation":true}},{"name":"c","lun":{"reservation":true}}]},"firmware":{"bootloader":{"efi":[true]}}},"volumes":[{"name":"m","downwardMetrics":{}}]}"#,
            r#"{"domain":{"firmware":{"bootloader":{"efi":{"persistent":true}}},"devices":{"tpm":{"persistent":true},"gpus":[{"name":"g"}]}}}"#,
            r#"{"domain":{}}"#,
        ];
        for text in edges {
            specs.push(serde_json::from_str(text).expect("an edge spec"));
        }
        let mut requesting = 0;
        for spec in &specs {
            let typed = features_requested(spec, "spec");
            assert_eq!(typed, by_json(spec, "spec"), "{spec:?}");
            requesting += usize::from(!typed.is_empty());
        }
        assert!(requesting >= 2, "some specs request features");
    }
}
