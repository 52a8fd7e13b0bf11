//! The field names KubeVirt's API knows, to warn of the ones it does not.
//!
//! vmplane stores a manifest as it was written (every field it does not interpret is kept), so a
//! misspelled field (`spec.template.spec.terminationGracePeriodSecond`, `domain.memory.gest`)
//! would be stored and silently ignored. Kubernetes' API server reports such fields with a
//! warning (`kubectl apply` with field validation `Warn`): `unknown field "spec.bogus"`.
//! [`unknown_fields`] finds them with a table of the field names of KubeVirt's objects (written
//! for vmplane from the names in KubeVirt's published OpenAPI definitions, KubeVirt v1.9), so
//! the gateway can give the same warning while still accepting the object, as the API server
//! does.
//!
//! What the table models, and what it leaves open (any key accepted below these points):
//! * `status` of every kind: written by the server, never checked.
//! * Free-form maps: `labels`, `annotations`, `nodeSelector`, `resources.requests|limits`,
//!   `newMacAddresses`, and the like.
//! * Kubernetes' own types that KubeVirt embeds whole: `affinity`,
//!   `topologySpreadConstraints[].labelSelector`, `downwardAPI.fields`, `managedFields`.
//! * `spec.dataVolumeTemplates[].spec` (CDI's DataVolumeSpec, versioned apart from KubeVirt)
//!   and `.status`; the templates' own top level and `metadata` are checked.
//! * The KubeVirt CR's `spec.configuration`: its own keys and `developerConfiguration` are
//!   checked, the other sections are not.
//! * The kinds vmplane parses but does not manage (VirtualMachinePool,
//!   VirtualMachineInstanceReplicaSet, VirtualMachineInstanceMigration): their top level and
//!   `metadata` only.
//!
//! Pure, and cheap on the apply path: one walk over the parsed document, a scan of a short
//! table per key, and nothing allocated unless a field is unknown (well under a microsecond
//! for a typical VM, `core/tests/unknown_fields.rs`).

use serde_json::Value;

use crate::types::Kind;

/// A place in the schema.
#[derive(Debug, Clone, Copy)]
enum Node {
    /// Any value: a scalar, a free-form map, or a subtree the table does not model.
    Any,
    /// An object with exactly these fields (kept sorted by name, and so without duplicates).
    Obj(&'static [(&'static str, Node)]),
    /// A list whose items are this node.
    List(&'static Node),
}

use Node::{Any, List, Obj};

/// An empty struct (`masquerade: {}`): any key inside is unknown.
const EMPTY: Node = Obj(&[]);

const OWNER_REFERENCE: Node = Obj(&[
    ("apiVersion", Any),
    ("blockOwnerDeletion", Any),
    ("controller", Any),
    ("kind", Any),
    ("name", Any),
    ("uid", Any),
]);

/// Kubernetes' ObjectMeta.
const OBJECT_META: Node = Obj(&[
    ("annotations", Any),
    ("creationTimestamp", Any),
    ("deletionGracePeriodSeconds", Any),
    ("deletionTimestamp", Any),
    ("finalizers", Any),
    ("generateName", Any),
    ("generation", Any),
    ("labels", Any),
    ("managedFields", Any),
    ("name", Any),
    ("namespace", Any),
    ("ownerReferences", List(&OWNER_REFERENCE)),
    ("resourceVersion", Any),
    ("selfLink", Any),
    ("uid", Any),
]);

/// Kubernetes' LocalObjectReference.
const LOCAL_REF: Node = Obj(&[("name", Any)]);

/// Kubernetes' TypedLocalObjectReference.
const TYPED_LOCAL_REF: Node = Obj(&[("apiGroup", Any), ("kind", Any), ("name", Any)]);

const FEATURE_STATE: Node = Obj(&[("enabled", Any)]);

// --- DomainSpec -----------------------------------------------------------------------------

const CPU_FEATURE: Node = Obj(&[("name", Any), ("policy", Any)]);
const NUMA: Node = Obj(&[("guestMappingPassthrough", EMPTY)]);
const REALTIME: Node = Obj(&[("mask", Any)]);

const CPU: Node = Obj(&[
    ("cores", Any),
    ("dedicatedCpuPlacement", Any),
    ("features", List(&CPU_FEATURE)),
    ("isolateEmulatorThread", Any),
    ("maxSockets", Any),
    ("model", Any),
    ("numa", NUMA),
    ("realtime", REALTIME),
    ("sockets", Any),
    ("threads", Any),
]);

const HUGEPAGES: Node = Obj(&[("pageSize", Any)]);

const MEMORY: Node = Obj(&[
    ("guest", Any),
    ("hugepages", HUGEPAGES),
    ("maxGuest", Any),
    (
        "reservedOverhead",
        Obj(&[("addedOverhead", Any), ("memLock", Any)]),
    ),
]);

const RESOURCES: Node = Obj(&[
    ("limits", Any),
    ("overcommitGuestOverhead", Any),
    ("requests", Any),
]);

const BLOCK_SIZE: Node = Obj(&[
    (
        "custom",
        Obj(&[
            ("discardGranularity", Any),
            ("logical", Any),
            ("physical", Any),
        ]),
    ),
    ("matchVolume", FEATURE_STATE),
]);

const DISK: Node = Obj(&[
    ("blockSize", BLOCK_SIZE),
    ("bootOrder", Any),
    ("cache", Any),
    (
        "cdrom",
        Obj(&[("bus", Any), ("readonly", Any), ("tray", Any)]),
    ),
    ("changedBlockTracking", Any),
    ("dedicatedIOThread", Any),
    (
        "disk",
        Obj(&[("bus", Any), ("pciAddress", Any), ("readonly", Any)]),
    ),
    ("errorPolicy", Any),
    ("io", Any),
    (
        "lun",
        Obj(&[("bus", Any), ("readonly", Any), ("reservation", Any)]),
    ),
    ("name", Any),
    ("serial", Any),
    ("shareable", Any),
    ("tag", Any),
]);

const DHCP_OPTIONS: Node = Obj(&[
    ("bootFileName", Any),
    ("ntpServers", Any),
    (
        "privateOptions",
        List(&Obj(&[("option", Any), ("value", Any)])),
    ),
    ("tftpServerName", Any),
]);

const INTERFACE: Node = Obj(&[
    ("acpiIndex", Any),
    ("binding", Obj(&[("name", Any)])),
    ("bootOrder", Any),
    ("bridge", EMPTY),
    ("dhcpOptions", DHCP_OPTIONS),
    ("macAddress", Any),
    ("macvtap", EMPTY),
    ("masquerade", EMPTY),
    ("model", Any),
    ("name", Any),
    ("passt", EMPTY),
    ("passtBinding", EMPTY),
    ("pciAddress", Any),
    (
        "portRanges",
        List(&Obj(&[("end", Any), ("protocol", Any), ("start", Any)])),
    ),
    (
        "ports",
        List(&Obj(&[("name", Any), ("port", Any), ("protocol", Any)])),
    ),
    ("slirp", EMPTY),
    ("sriov", EMPTY),
    ("state", Any),
    ("tag", Any),
]);

const VGPU_OPTIONS: Node = Obj(&[(
    "display",
    Obj(&[("enabled", Any), ("ramFB", FEATURE_STATE)]),
)]);

const GPU: Node = Obj(&[
    ("claimName", Any),
    ("deviceName", Any),
    ("name", Any),
    ("requestName", Any),
    ("tag", Any),
    ("virtualGPUOptions", VGPU_OPTIONS),
]);

const HOST_DEVICE: Node = Obj(&[
    ("claimName", Any),
    ("deviceName", Any),
    ("name", Any),
    ("requestName", Any),
    ("tag", Any),
]);

const TPM: Node = Obj(&[("enabled", Any), ("persistent", Any)]);

const WATCHDOG_ACTION: Node = Obj(&[("action", Any)]);

const DEVICES: Node = Obj(&[
    ("autoattachGraphicsDevice", Any),
    ("autoattachInputDevice", Any),
    ("autoattachMemBalloon", Any),
    ("autoattachPodInterface", Any),
    ("autoattachSerialConsole", Any),
    ("autoattachVSOCK", Any),
    ("blockMultiQueue", Any),
    ("clientPassthrough", EMPTY),
    ("disableHotplug", Any),
    ("disks", List(&DISK)),
    ("downwardMetrics", EMPTY),
    (
        "filesystems",
        List(&Obj(&[("name", Any), ("virtiofs", EMPTY)])),
    ),
    ("gpus", List(&GPU)),
    ("hostDevices", List(&HOST_DEVICE)),
    (
        "inputs",
        List(&Obj(&[("bus", Any), ("name", Any), ("type", Any)])),
    ),
    ("interfaces", List(&INTERFACE)),
    ("logSerialConsole", Any),
    ("networkInterfaceMultiqueue", Any),
    ("panicDevices", List(&Obj(&[("model", Any)]))),
    ("rng", EMPTY),
    ("sound", Obj(&[("model", Any), ("name", Any)])),
    ("tpm", TPM),
    ("useVirtioTransitional", Any),
    ("video", Obj(&[("type", Any)])),
    (
        "watchdog",
        Obj(&[
            ("diag288", WATCHDOG_ACTION),
            ("i6300esb", WATCHDOG_ACTION),
            ("name", Any),
        ]),
    ),
]);

const TIMER_PRESENT: Node = Obj(&[("present", Any)]);
const TIMER_TICK: Node = Obj(&[("present", Any), ("tickPolicy", Any)]);

const TIMER: Node = Obj(&[
    ("hpet", TIMER_TICK),
    ("hyperv", TIMER_PRESENT),
    ("kvm", TIMER_PRESENT),
    ("pit", TIMER_TICK),
    (
        "rtc",
        Obj(&[("present", Any), ("tickPolicy", Any), ("track", Any)]),
    ),
]);

const CLOCK_UTC: Node = Obj(&[("offsetSeconds", Any)]);

const CLOCK: Node = Obj(&[("timer", TIMER), ("timezone", Any), ("utc", CLOCK_UTC)]);

const CLOCK_OFFSET: Node = Obj(&[("timezone", Any), ("utc", CLOCK_UTC)]);

const FEATURE_APIC: Node = Obj(&[("enabled", Any), ("endOfInterrupt", Any)]);
const FEATURE_KVM: Node = Obj(&[("hidden", Any)]);

const HYPERV: Node = Obj(&[
    ("evmcs", FEATURE_STATE),
    ("frequencies", FEATURE_STATE),
    ("ipi", FEATURE_STATE),
    ("reenlightenment", FEATURE_STATE),
    ("relaxed", FEATURE_STATE),
    ("reset", FEATURE_STATE),
    ("runtime", FEATURE_STATE),
    ("spinlocks", Obj(&[("enabled", Any), ("spinlocks", Any)])),
    ("synic", FEATURE_STATE),
    (
        "synictimer",
        Obj(&[("direct", FEATURE_STATE), ("enabled", Any)]),
    ),
    (
        "tlbflush",
        Obj(&[
            ("direct", FEATURE_STATE),
            ("enabled", Any),
            ("extended", FEATURE_STATE),
        ]),
    ),
    ("vapic", FEATURE_STATE),
    ("vendorid", Obj(&[("enabled", Any), ("vendorid", Any)])),
    ("vpindex", FEATURE_STATE),
]);

const FEATURES: Node = Obj(&[
    ("acpi", FEATURE_STATE),
    ("apic", FEATURE_APIC),
    ("hyperv", HYPERV),
    ("hypervPassthrough", FEATURE_STATE),
    ("kvm", FEATURE_KVM),
    ("pvspinlock", FEATURE_STATE),
    ("smm", FEATURE_STATE),
]);

const EFI: Node = Obj(&[("persistent", Any), ("secureBoot", Any)]);

const FIRMWARE: Node = Obj(&[
    ("acpi", Obj(&[("msdmNameRef", Any), ("slicNameRef", Any)])),
    (
        "bootloader",
        Obj(&[("bios", Obj(&[("useSerial", Any)])), ("efi", EFI)]),
    ),
    (
        "kernelBoot",
        Obj(&[
            (
                "container",
                Obj(&[
                    ("image", Any),
                    ("imagePullPolicy", Any),
                    ("imagePullSecret", Any),
                    ("initrdPath", Any),
                    ("kernelPath", Any),
                ]),
            ),
            ("kernelArgs", Any),
        ]),
    ),
    ("serial", Any),
    ("uuid", Any),
]);

const LAUNCH_SECURITY: Node = Obj(&[
    (
        "sev",
        Obj(&[
            ("attestation", EMPTY),
            ("dhCert", Any),
            ("policy", Obj(&[("encryptedState", Any)])),
            ("session", Any),
        ]),
    ),
    ("snp", EMPTY),
    ("tdx", EMPTY),
]);

const IO_THREADS: Node = Obj(&[("supplementalPoolThreadCount", Any)]);

const DOMAIN: Node = Obj(&[
    (
        "chassis",
        Obj(&[
            ("asset", Any),
            ("manufacturer", Any),
            ("serial", Any),
            ("sku", Any),
            ("version", Any),
        ]),
    ),
    ("clock", CLOCK),
    ("cpu", CPU),
    ("devices", DEVICES),
    ("features", FEATURES),
    ("firmware", FIRMWARE),
    ("ioThreads", IO_THREADS),
    ("ioThreadsPolicy", Any),
    ("launchSecurity", LAUNCH_SECURITY),
    ("machine", Obj(&[("type", Any)])),
    ("memory", MEMORY),
    ("rebootPolicy", Any),
    ("resources", RESOURCES),
]);

// --- VirtualMachineInstanceSpec -------------------------------------------------------------

const CLOUD_INIT: Node = Obj(&[
    ("networkData", Any),
    ("networkDataBase64", Any),
    ("networkDataSecretRef", LOCAL_REF),
    ("secretRef", LOCAL_REF),
    ("userData", Any),
    ("userDataBase64", Any),
]);

const PVC_SOURCE: Node = Obj(&[("claimName", Any), ("hotpluggable", Any), ("readOnly", Any)]);

const VOLUME: Node = Obj(&[
    ("cloudInitConfigDrive", CLOUD_INIT),
    ("cloudInitNoCloud", CLOUD_INIT),
    (
        "configMap",
        Obj(&[("name", Any), ("optional", Any), ("volumeLabel", Any)]),
    ),
    (
        "containerDisk",
        Obj(&[
            ("image", Any),
            ("imagePullPolicy", Any),
            ("imagePullSecret", Any),
            ("path", Any),
        ]),
    ),
    ("containerPath", Obj(&[("path", Any), ("readOnly", Any)])),
    ("dataVolume", Obj(&[("hotpluggable", Any), ("name", Any)])),
    ("downwardAPI", Obj(&[("fields", Any), ("volumeLabel", Any)])),
    ("downwardMetrics", EMPTY),
    ("emptyDisk", Obj(&[("capacity", Any)])),
    (
        "ephemeral",
        Obj(&[(
            "persistentVolumeClaim",
            Obj(&[("claimName", Any), ("readOnly", Any)]),
        )]),
    ),
    (
        "hostDisk",
        Obj(&[
            ("capacity", Any),
            ("path", Any),
            ("shared", Any),
            ("type", Any),
        ]),
    ),
    ("memoryDump", PVC_SOURCE),
    ("name", Any),
    ("persistentVolumeClaim", PVC_SOURCE),
    (
        "secret",
        Obj(&[("optional", Any), ("secretName", Any), ("volumeLabel", Any)]),
    ),
    ("serviceAccount", Obj(&[("serviceAccountName", Any)])),
    (
        "sysprep",
        Obj(&[("configMap", LOCAL_REF), ("secret", LOCAL_REF)]),
    ),
]);

const NETWORK: Node = Obj(&[
    ("multus", Obj(&[("default", Any), ("networkName", Any)])),
    ("name", Any),
    (
        "pod",
        Obj(&[("vmIPv6NetworkCIDR", Any), ("vmNetworkCIDR", Any)]),
    ),
    (
        "resourceClaim",
        Obj(&[("claimName", Any), ("requestName", Any)]),
    ),
]);

const SECRET_SOURCE: Node = Obj(&[("secret", Obj(&[("secretName", Any)]))]);

const ACCESS_CREDENTIAL: Node = Obj(&[
    (
        "sshPublicKey",
        Obj(&[
            (
                "propagationMethod",
                Obj(&[
                    ("configDrive", EMPTY),
                    ("noCloud", EMPTY),
                    ("qemuGuestAgent", Obj(&[("users", Any)])),
                ]),
            ),
            ("source", SECRET_SOURCE),
        ]),
    ),
    (
        "userPassword",
        Obj(&[
            ("propagationMethod", Obj(&[("qemuGuestAgent", EMPTY)])),
            ("source", SECRET_SOURCE),
        ]),
    ),
]);

const PROBE: Node = Obj(&[
    ("exec", Obj(&[("command", Any)])),
    ("failureThreshold", Any),
    ("guestAgentPing", EMPTY),
    (
        "httpGet",
        Obj(&[
            ("host", Any),
            ("httpHeaders", List(&Obj(&[("name", Any), ("value", Any)]))),
            ("path", Any),
            ("port", Any),
            ("scheme", Any),
        ]),
    ),
    ("initialDelaySeconds", Any),
    ("periodSeconds", Any),
    ("successThreshold", Any),
    ("tcpSocket", Obj(&[("host", Any), ("port", Any)])),
    ("timeoutSeconds", Any),
]);

/// Kubernetes' Toleration.
const TOLERATION: Node = Obj(&[
    ("effect", Any),
    ("key", Any),
    ("operator", Any),
    ("tolerationSeconds", Any),
    ("value", Any),
]);

/// Kubernetes' TopologySpreadConstraint (its label selector left open).
const TOPOLOGY_SPREAD: Node = Obj(&[
    ("labelSelector", Any),
    ("matchLabelKeys", Any),
    ("maxSkew", Any),
    ("minDomains", Any),
    ("nodeAffinityPolicy", Any),
    ("nodeTaintsPolicy", Any),
    ("topologyKey", Any),
    ("whenUnsatisfiable", Any),
]);

/// Kubernetes' PodDNSConfig.
const DNS_CONFIG: Node = Obj(&[
    ("nameservers", Any),
    ("options", List(&Obj(&[("name", Any), ("value", Any)]))),
    ("searches", Any),
]);

const VMI_SPEC: Node = Obj(&[
    ("accessCredentials", List(&ACCESS_CREDENTIAL)),
    ("affinity", Any),
    ("architecture", Any),
    ("dnsConfig", DNS_CONFIG),
    ("dnsPolicy", Any),
    ("domain", DOMAIN),
    ("evictionStrategy", Any),
    ("hostname", Any),
    ("livenessProbe", PROBE),
    ("networks", List(&NETWORK)),
    ("nodeSelector", Any),
    ("priorityClassName", Any),
    ("readinessProbe", PROBE),
    (
        "resourceClaims",
        List(&Obj(&[
            ("name", Any),
            ("resourceClaimName", Any),
            ("resourceClaimTemplateName", Any),
        ])),
    ),
    ("schedulerName", Any),
    ("serviceAccountName", Any),
    ("startStrategy", Any),
    ("subdomain", Any),
    ("terminationGracePeriodSeconds", Any),
    ("tolerations", List(&TOLERATION)),
    ("topologySpreadConstraints", List(&TOPOLOGY_SPREAD)),
    (
        "utilityVolumes",
        List(&Obj(&[
            ("claimName", Any),
            ("name", Any),
            ("readOnly", Any),
            ("type", Any),
        ])),
    ),
    ("volumes", List(&VOLUME)),
]);

const VMI_TEMPLATE: Node = Obj(&[("metadata", OBJECT_META), ("spec", VMI_SPEC)]);

// --- VirtualMachineSpec ---------------------------------------------------------------------

const MATCHER: Node = Obj(&[
    ("inferFromVolume", Any),
    ("inferFromVolumeFailurePolicy", Any),
    ("kind", Any),
    ("name", Any),
    ("revisionName", Any),
]);

/// A VM's `dataVolumeTemplates[]`: CDI's DataVolumeSpec and the dummy status left open.
const DATA_VOLUME_TEMPLATE: Node = Obj(&[
    ("apiVersion", Any),
    ("kind", Any),
    ("metadata", OBJECT_META),
    ("spec", Any),
    ("status", Any),
]);

const VM_SPEC: Node = Obj(&[
    ("dataVolumeTemplates", List(&DATA_VOLUME_TEMPLATE)),
    ("instancetype", MATCHER),
    ("preference", MATCHER),
    ("runStrategy", Any),
    ("running", Any),
    ("template", VMI_TEMPLATE),
    ("updateVolumesStrategy", Any),
]);

// --- instancetype.kubevirt.io ---------------------------------------------------------------

const INSTANCETYPE_SPEC: Node = Obj(&[
    ("annotations", Any),
    (
        "cpu",
        Obj(&[
            ("dedicatedCPUPlacement", Any),
            ("guest", Any),
            ("isolateEmulatorThread", Any),
            ("maxSockets", Any),
            ("model", Any),
            ("numa", NUMA),
            ("realtime", REALTIME),
        ]),
    ),
    ("gpus", List(&GPU)),
    ("hostDevices", List(&HOST_DEVICE)),
    ("ioThreads", IO_THREADS),
    ("ioThreadsPolicy", Any),
    ("launchSecurity", LAUNCH_SECURITY),
    (
        "memory",
        Obj(&[
            ("guest", Any),
            ("hugepages", HUGEPAGES),
            ("maxGuest", Any),
            ("overcommitPercent", Any),
        ]),
    ),
    ("nodeSelector", Any),
    ("schedulerName", Any),
]);

const DEVICE_PREFERENCES: Node = Obj(&[
    ("preferredAutoattachGraphicsDevice", Any),
    ("preferredAutoattachInputDevice", Any),
    ("preferredAutoattachMemBalloon", Any),
    ("preferredAutoattachPodInterface", Any),
    ("preferredAutoattachSerialConsole", Any),
    ("preferredBlockMultiQueue", Any),
    ("preferredCdromBus", Any),
    ("preferredDisableHotplug", Any),
    ("preferredDiskBlockSize", BLOCK_SIZE),
    ("preferredDiskBus", Any),
    ("preferredDiskCache", Any),
    ("preferredDiskDedicatedIoThread", Any),
    ("preferredDiskIO", Any),
    ("preferredInputBus", Any),
    ("preferredInputType", Any),
    ("preferredInterfaceMasquerade", EMPTY),
    ("preferredInterfaceModel", Any),
    ("preferredLunBus", Any),
    ("preferredNetworkInterfaceMultiQueue", Any),
    ("preferredPanicDeviceModel", Any),
    ("preferredRng", EMPTY),
    ("preferredSoundModel", Any),
    ("preferredTPM", TPM),
    ("preferredUseVirtioTransitional", Any),
    ("preferredVideoType", Any),
    ("preferredVirtualGPUOptions", VGPU_OPTIONS),
]);

const PREFERENCE_SPEC: Node = Obj(&[
    ("annotations", Any),
    (
        "clock",
        Obj(&[
            ("preferredClockOffset", CLOCK_OFFSET),
            ("preferredTimer", TIMER),
        ]),
    ),
    (
        "cpu",
        Obj(&[
            ("preferredCPUFeatures", List(&CPU_FEATURE)),
            ("preferredCPUTopology", Any),
            ("spreadOptions", Obj(&[("across", Any), ("ratio", Any)])),
        ]),
    ),
    ("devices", DEVICE_PREFERENCES),
    (
        "features",
        Obj(&[
            ("preferredAcpi", FEATURE_STATE),
            ("preferredApic", FEATURE_APIC),
            ("preferredHyperv", HYPERV),
            ("preferredKvm", FEATURE_KVM),
            ("preferredPvspinlock", FEATURE_STATE),
            ("preferredSmm", FEATURE_STATE),
        ]),
    ),
    (
        "firmware",
        Obj(&[
            ("preferredEfi", EFI),
            ("preferredUseBios", Any),
            ("preferredUseBiosSerial", Any),
            ("preferredUseEfi", Any),
            ("preferredUseSecureBoot", Any),
        ]),
    ),
    ("machine", Obj(&[("preferredMachineType", Any)])),
    ("preferSpreadSocketToCoreRatio", Any),
    ("preferredArchitecture", Any),
    ("preferredLaunchSecurity", LAUNCH_SECURITY),
    ("preferredSubdomain", Any),
    ("preferredTerminationGracePeriodSeconds", Any),
    (
        "requirements",
        Obj(&[
            ("architecture", Any),
            ("cpu", Obj(&[("guest", Any)])),
            ("memory", Obj(&[("guest", Any)])),
        ]),
    ),
    ("volumes", Obj(&[("preferredStorageClassName", Any)])),
]);

// --- snapshot.kubevirt.io, clone.kubevirt.io ------------------------------------------------

const SNAPSHOT_SPEC: Node = Obj(&[
    ("deletionPolicy", Any),
    ("failureDeadline", Any),
    ("source", TYPED_LOCAL_REF),
]);

const RESTORE_SPEC: Node = Obj(&[
    ("patches", Any),
    ("target", TYPED_LOCAL_REF),
    ("targetReadinessPolicy", Any),
    ("virtualMachineSnapshotName", Any),
    ("volumeOwnershipPolicy", Any),
    (
        "volumeRestoreOverrides",
        List(&Obj(&[
            ("annotations", Any),
            ("labels", Any),
            ("restoreName", Any),
            ("volumeName", Any),
        ])),
    ),
    ("volumeRestorePolicy", Any),
]);

const CLONE_SPEC: Node = Obj(&[
    ("annotationFilters", Any),
    ("labelFilters", Any),
    ("newMacAddresses", Any),
    ("newSMBiosSerial", Any),
    ("patches", Any),
    ("source", TYPED_LOCAL_REF),
    ("target", TYPED_LOCAL_REF),
    (
        "template",
        Obj(&[("annotationFilters", Any), ("labelFilters", Any)]),
    ),
    ("volumeNamePolicy", Any),
]);

// --- kubevirt.io KubeVirt -------------------------------------------------------------------

const DEVELOPER_CONFIGURATION: Node = Obj(&[
    ("clusterProfiler", Any),
    ("cpuAllocationRatio", Any),
    ("disabledFeatureGates", Any),
    ("diskVerification", Any),
    ("featureGates", Any),
    ("logVerbosity", Any),
    ("memoryOvercommit", Any),
    ("minimumClusterTSCFrequency", Any),
    ("minimumReservePVCBytes", Any),
    ("nodeSelectors", Any),
    ("pvcTolerateLessSpaceUpToPercent", Any),
    ("useEmulation", Any),
]);

/// KubeVirtConfiguration: its own keys; the sections below them are left open but for
/// `developerConfiguration` (the feature gates).
const KUBEVIRT_CONFIGURATION: Node = Obj(&[
    ("additionalGuestMemoryOverheadRatio", Any),
    ("apiConfiguration", Any),
    ("architectureConfiguration", Any),
    ("autoCPULimitNamespaceLabelSelector", Any),
    ("changedBlockTrackingLabelSelectors", Any),
    ("commonInstancetypesDeployment", Any),
    ("confidentialCompute", Any),
    ("controllerConfiguration", Any),
    ("cpuModel", Any),
    ("cpuRequest", Any),
    ("defaultRuntimeClass", Any),
    ("developerConfiguration", DEVELOPER_CONFIGURATION),
    ("emulatedMachines", Any),
    ("evictionStrategy", Any),
    ("handlerConfiguration", Any),
    ("hypervisors", Any),
    ("imagePullPolicy", Any),
    ("instancetype", Any),
    ("ksmConfiguration", Any),
    ("liveUpdateConfiguration", Any),
    ("machineType", Any),
    ("mediatedDevicesConfiguration", Any),
    ("memBalloonStatsPeriod", Any),
    ("migrations", Any),
    ("minCPUModel", Any),
    ("network", Any),
    ("obsoleteCPUModels", Any),
    ("ovmfPath", Any),
    ("permittedHostDevices", Any),
    ("persistentReservationConfiguration", Any),
    ("roleAggregationStrategy", Any),
    ("seccompConfiguration", Any),
    ("selinuxLauncherType", Any),
    ("smbios", Any),
    ("supportContainerResources", Any),
    ("supportedGuestAgentVersions", Any),
    ("tlsConfiguration", Any),
    ("virtTemplateDeployment", Any),
    ("virtualMachineInstancesPerNode", Any),
    ("virtualMachineOptions", Any),
    ("vmRolloutStrategy", Any),
    ("vmStateStorageClass", Any),
    ("webhookConfiguration", Any),
]);

const KUBEVIRT_SPEC: Node = Obj(&[
    ("certificateRotateStrategy", Any),
    ("configuration", KUBEVIRT_CONFIGURATION),
    ("customizeComponents", Any),
    ("imagePullPolicy", Any),
    ("imagePullSecrets", List(&LOCAL_REF)),
    ("imageRegistry", Any),
    ("imageTag", Any),
    ("infra", Any),
    ("monitorAccount", Any),
    ("monitorNamespace", Any),
    ("productComponent", Any),
    ("productName", Any),
    ("productVersion", Any),
    ("serviceMonitorNamespace", Any),
    ("synchronizationPlacement", Any),
    ("synchronizationPort", Any),
    ("uninstallStrategy", Any),
    ("workloadUpdateStrategy", Any),
    ("workloads", Any),
]);

// --- top level ------------------------------------------------------------------------------

/// An object of a kind: `apiVersion`, `kind`, `metadata`, `spec` (as given) and `status` (never
/// checked: the server's).
macro_rules! object {
    ($spec:expr) => {
        Obj(&[
            ("apiVersion", Any),
            ("kind", Any),
            ("metadata", OBJECT_META),
            ("spec", $spec),
            ("status", Any),
        ])
    };
}

const VIRTUAL_MACHINE: Node = object!(VM_SPEC);
const VIRTUAL_MACHINE_INSTANCE: Node = object!(VMI_SPEC);
const INSTANCETYPE: Node = object!(INSTANCETYPE_SPEC);
const PREFERENCE: Node = object!(PREFERENCE_SPEC);
const KUBEVIRT: Node = object!(KUBEVIRT_SPEC);
const SNAPSHOT: Node = object!(SNAPSHOT_SPEC);
const RESTORE: Node = object!(RESTORE_SPEC);
const CLONE: Node = object!(CLONE_SPEC);
/// A kind vmplane parses but does not manage: its top level and metadata.
const UNMANAGED: Node = object!(Any);

fn root(kind: Kind) -> Node {
    match kind {
        Kind::VirtualMachine => VIRTUAL_MACHINE,
        Kind::VirtualMachineInstance => VIRTUAL_MACHINE_INSTANCE,
        Kind::VirtualMachineInstancetype | Kind::VirtualMachineClusterInstancetype => INSTANCETYPE,
        Kind::VirtualMachinePreference | Kind::VirtualMachineClusterPreference => PREFERENCE,
        Kind::KubeVirt => KUBEVIRT,
        Kind::VirtualMachineSnapshot => SNAPSHOT,
        Kind::VirtualMachineRestore => RESTORE,
        Kind::VirtualMachineClone => CLONE,
        Kind::VirtualMachinePool
        | Kind::VirtualMachineInstanceReplicaSet
        | Kind::VirtualMachineInstanceMigration => UNMANAGED,
    }
}

/// Where the walk is: a chain of frames on the stack, rendered only for an unknown field.
enum At<'a> {
    Root,
    Field(&'a At<'a>, &'a str),
    Item(&'a At<'a>, usize),
}

impl At<'_> {
    fn render(&self, out: &mut String) {
        match self {
            At::Root => {}
            At::Field(parent, name) => {
                parent.render(out);
                if !matches!(parent, At::Root) {
                    out.push('.');
                }
                out.push_str(name);
            }
            At::Item(parent, i) => {
                parent.render(out);
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
}

fn walk(node: Node, value: &Value, at: &At<'_>, out: &mut Vec<String>) {
    match (node, value) {
        (Obj(fields), Value::Object(map)) => {
            for (key, child) in map {
                let here = At::Field(at, key);
                // A scan: measured ~5x faster than a binary search over these short tables.
                match fields.iter().find(|(name, _)| *name == key.as_str()) {
                    Some((_, node)) => walk(*node, child, &here, out),
                    None => {
                        let mut path = String::new();
                        here.render(&mut path);
                        out.push(path);
                    }
                }
            }
        }
        (List(item), Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                walk(*item, child, &At::Item(at, i), out);
            }
        }
        // A scalar, an open subtree, or a value of the wrong type (the parser's to refuse).
        _ => {}
    }
}

/// The paths of the fields in `object` (one whole manifest of `kind`) that KubeVirt's API does
/// not know, in document order, as Kubernetes prints them: dot-separated names, `[i]` for a
/// list item (`spec.template.spec.domain.devices.disks[0].dik`). Empty for a manifest that
/// uses only known fields (nothing is allocated then). See the module's doc for the subtrees
/// left open.
pub fn unknown_fields(kind: Kind, object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(root(kind), object, &At::Root, &mut out);
    out
}

/// The warning for an unknown field, in the API server's words: `unknown field "spec.bogus"`.
pub fn unknown_field_warning(path: &str) -> String {
    format!("unknown field \"{path}\"")
}

/// The deprecation warning KubeVirt's API server gives for an object written in a deprecated
/// API version, in KubeVirt's words (its CRD's `deprecationWarning`), or `None` for a current
/// one. Only `kubevirt.io/v1alpha3` is deprecated and still served.
pub fn deprecated_api_version(api_version: &str) -> Option<String> {
    crate::types::deprecated_api_version(api_version)
}

/// The kind of a manifest for [`unknown_fields`]: [`Kind::from_api`], and for the deprecated
/// `kubevirt.io/v1alpha3` the `kubevirt.io/v1` kind of the same name (the same schema).
pub fn kind_of(api_version: &str, kind: &str) -> Option<Kind> {
    Kind::from_api(api_version, kind).or_else(|| {
        (api_version == "kubevirt.io/v1alpha3")
            .then(|| Kind::from_api("kubevirt.io/v1", kind))
            .flatten()
    })
}

/// Every apply warning of one parsed document that the schema gives, in the order the API
/// server would give them: the API version's deprecation, then each unknown field. A document
/// that is not an object, or of a kind vmplane does not know, gives none (the apply refuses it).
pub fn warnings(document: &Value) -> Vec<String> {
    let api_version = document.get("apiVersion").and_then(Value::as_str);
    let kind = document.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (api_version, kind) else {
        return Vec::new();
    };
    let mut out: Vec<String> = deprecated_api_version(api_version).into_iter().collect();
    if let Some(kind) = kind_of(api_version, kind) {
        let unknown = unknown_fields(kind, document);
        out.extend(unknown.iter().map(|p| unknown_field_warning(p)));
    }
    out
}

/// [`warnings`] of a manifest given as one JSON object, read straight from its text without
/// building its JSON tree (what gRPC clients send; `apply` is on the hot path: this costs about
/// what reading the text once costs). `None` when the text is not a JSON object whose
/// `apiVersion` and `kind` come before its `spec` (what every client writing JSON does), or
/// when it does not read: the caller then takes [`warnings`] of the parsed document, which
/// gives the same answer for any text.
pub fn warnings_of_json(text: &str) -> Option<Vec<String>> {
    use serde::de::DeserializeSeed;
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let top = TopSeed { out: &mut out }.deserialize(&mut de).ok()??;
    de.end().ok()?;
    let mut warnings: Vec<String> = deprecated_api_version(&top).into_iter().collect();
    warnings.extend(out.iter().map(|p| unknown_field_warning(p)));
    Some(warnings)
}

/// Reads a manifest's top level for [`warnings_of_json`]: its `apiVersion` (answered, when
/// `kind` names a kind vmplane knows) and the unknown fields below it into `out`.
struct TopSeed<'o> {
    out: &'o mut Vec<String>,
}

impl<'de> serde::de::DeserializeSeed<'de> for TopSeed<'_> {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopSeed<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a manifest")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::IgnoredAny;
        use std::borrow::Cow;
        let mut api_version: Option<Cow<'de, str>> = None;
        let mut kind_name: Option<Cow<'de, str>> = None;
        let mut spec_too_early = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "apiVersion" => api_version = Some(map.next_value::<Cow<'de, str>>()?),
                "kind" => kind_name = Some(map.next_value::<Cow<'de, str>>()?),
                name => {
                    let kind = api_version
                        .as_deref()
                        .zip(kind_name.as_deref())
                        .and_then(|(v, k)| kind_of(v, k));
                    if name == "spec" && kind.is_none() {
                        // The spec's schema is the kind's: before the kind is known (or of a
                        // kind vmplane does not know) it cannot be walked in one pass.
                        spec_too_early = true;
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                    // Every kind's top level is the same but for its spec.
                    let node = match root(kind.unwrap_or(Kind::VirtualMachinePool)) {
                        Obj(fields) => fields.iter().find(|(n, _)| *n == name).map(|(_, n)| *n),
                        _ => None,
                    };
                    match node {
                        Some(node) => map.next_value_seed(NodeSeed {
                            node,
                            at: &At::Field(&At::Root, name),
                            out: self.out,
                        })?,
                        None => {
                            self.out.push(name.to_owned());
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
            }
        }
        let known = api_version
            .as_deref()
            .zip(kind_name.as_deref())
            .and_then(|(v, k)| kind_of(v, k));
        Ok(match (known, api_version) {
            (Some(_), Some(v)) if !spec_too_early => Some(v.into_owned()),
            // Not in one pass: the caller walks the tree. Of a kind vmplane does not know: the
            // tree walk gives no warnings either (the apply refuses it).
            _ => None,
        })
    }
}

/// Walks one value against `node` while reading it ([`walk`] without the tree).
struct NodeSeed<'a, 'o> {
    node: Node,
    at: &'a At<'a>,
    out: &'o mut Vec<String>,
}

impl<'de> serde::de::DeserializeSeed<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.node {
            Any => d.deserialize_ignored_any(serde::de::IgnoredAny).map(drop),
            _ => d.deserialize_any(self),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Obj(fields) = self.node else {
            // A value of the wrong type: the parser's to refuse.
            while map
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            return Ok(());
        };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let here = At::Field(self.at, &key);
            match fields.iter().find(|(name, _)| *name == key.as_ref()) {
                Some((_, node)) => map.next_value_seed(NodeSeed {
                    node: *node,
                    at: &here,
                    out: &mut *self.out,
                })?,
                None => {
                    let mut path = String::new();
                    here.render(&mut path);
                    self.out.push(path);
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let List(item) = self.node else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut i = 0;
        loop {
            let here = At::Item(self.at, i);
            let seed = NodeSeed {
                node: *item,
                at: &here,
                out: &mut *self.out,
            };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every object table reachable from every kind's root.
    fn tables() -> Vec<&'static [(&'static str, Node)]> {
        fn visit(node: Node, out: &mut Vec<&'static [(&'static str, Node)]>) {
            match node {
                Any => {}
                Obj(fields) => {
                    out.push(fields);
                    for (_, child) in fields {
                        visit(*child, out);
                    }
                }
                List(item) => visit(*item, out),
            }
        }
        let mut out = Vec::new();
        for kind in Kind::ALL {
            visit(root(kind), &mut out);
        }
        out
    }

    #[test]
    fn every_table_is_sorted_and_names_each_field_once() {
        for fields in tables() {
            for pair in fields.windows(2) {
                assert!(
                    pair[0].0 < pair[1].0,
                    "{:?} must come after {:?} (byte order)",
                    pair[0].0,
                    pair[1].0
                );
            }
        }
    }

    fn vm(spec: Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
               "metadata": {"name": "a", "labels": {"on": "yes"}}, "spec": spec})
    }

    #[test]
    fn misspelled_fields_are_named_by_their_path_with_list_indexes() {
        let v = vm(json!({
            "bogus": 1,
            "runStrategy": "Halted",
            "template": {"spec": {
                "terminationGracePeriodSecond": 0,
                "domain": {
                    "memory": {"gest": "1Gi"},
                    "devices": {
                        "disk": [],
                        "disks": [{"name": "a", "disk": {}}, {"name": "b", "dik": {}}],
                    },
                },
            }},
        }));
        assert_eq!(
            unknown_fields(Kind::VirtualMachine, &v),
            [
                "spec.bogus",
                "spec.template.spec.terminationGracePeriodSecond",
                "spec.template.spec.domain.memory.gest",
                "spec.template.spec.domain.devices.disk",
                "spec.template.spec.domain.devices.disks[1].dik",
            ]
        );
    }

    #[test]
    fn free_form_maps_status_and_open_subtrees_are_not_checked() {
        let v = vm(json!({
            "dataVolumeTemplates": [{"metadata": {"name": "d"}, "spec": {"anything": 1}}],
            "template": {
                "metadata": {"annotations": {"x/y": "1"}, "labels": {"k": "v"}},
                "spec": {
                    "nodeSelector": {"whatever": "x"},
                    "affinity": {"nodeAffinity": {"made": "up"}},
                    "domain": {"resources": {"requests": {"memory": "1Gi", "foo.io/gpu": 1}}},
                },
            },
        }));
        let mut v = v;
        v["status"] = json!({"printableStatus": "Stopped", "madeUp": true});
        assert!(unknown_fields(Kind::VirtualMachine, &v).is_empty());
    }

    #[test]
    fn every_managed_kind_checks_its_spec() {
        for (kind, api_version) in [
            (Kind::VirtualMachineInstance, "kubevirt.io/v1"),
            (
                Kind::VirtualMachineInstancetype,
                "instancetype.kubevirt.io/v1beta1",
            ),
            (
                Kind::VirtualMachineClusterInstancetype,
                "instancetype.kubevirt.io/v1beta1",
            ),
            (
                Kind::VirtualMachinePreference,
                "instancetype.kubevirt.io/v1beta1",
            ),
            (
                Kind::VirtualMachineClusterPreference,
                "instancetype.kubevirt.io/v1beta1",
            ),
            (Kind::KubeVirt, "kubevirt.io/v1"),
            (Kind::VirtualMachineSnapshot, "snapshot.kubevirt.io/v1beta1"),
            (Kind::VirtualMachineRestore, "snapshot.kubevirt.io/v1beta1"),
            (Kind::VirtualMachineClone, "clone.kubevirt.io/v1beta1"),
        ] {
            let v = json!({"apiVersion": api_version, "kind": kind.as_str(),
                           "metadata": {"name": "a", "nmae": "b"}, "spec": {"bogus": 1}});
            assert_eq!(
                unknown_fields(kind, &v),
                ["metadata.nmae", "spec.bogus"],
                "{kind}"
            );
        }
    }

    #[test]
    fn the_kubevirt_cr_checks_its_configuration_keys_and_feature_gates_section() {
        let v = json!({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {
            "developerConfiguration": {"featureGate": ["Snapshot"]},
            "migrations": {"anything": 1},
            "vmRolloutStrategys": "LiveUpdate",
        }}});
        assert_eq!(
            unknown_fields(Kind::KubeVirt, &v),
            [
                "spec.configuration.developerConfiguration.featureGate",
                "spec.configuration.vmRolloutStrategys",
            ]
        );
    }

    #[test]
    fn warnings_give_the_deprecation_then_each_unknown_field_in_kubernetes_words() {
        let v = json!({"apiVersion": "kubevirt.io/v1alpha3", "kind": "VirtualMachine",
                       "metadata": {"name": "a"}, "spec": {"bogus": 1}});
        assert_eq!(
            warnings(&v),
            [
                "kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release.",
                "unknown field \"spec.bogus\"",
            ]
        );
        assert_eq!(deprecated_api_version("kubevirt.io/v1"), None);
        assert!(warnings(&json!({"apiVersion": "v1", "kind": "Pod", "spec": {"x": 1}})).is_empty());
        assert!(warnings(&json!([1, 2])).is_empty());
    }
}
