//! Rejections: why a command changed nothing, with every cause and its field path.

use std::fmt;

/// What kind of failure a rejection is; the gateway maps it to a gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// The input is malformed or breaks a rule (gRPC `InvalidArgument`).
    Invalid,
    /// The object (or one it references) does not exist (`NotFound`).
    NotFound,
    /// The object, or a unique value it claims, exists already (`AlreadyExists`).
    AlreadyExists,
    /// The client's expected generation is not the current one (`Aborted`).
    Conflict,
    /// The object is not in a state that allows the request (`FailedPrecondition`, KubeVirt's 409s).
    FailedPrecondition,
    /// The input is over a size limit (`ResourceExhausted`).
    ResourceExhausted,
}

impl Category {
    /// The gRPC status code name this category maps to.
    pub fn grpc_code_name(self) -> &'static str {
        match self {
            Category::Invalid => "InvalidArgument",
            Category::NotFound => "NotFound",
            Category::AlreadyExists => "AlreadyExists",
            Category::Conflict => "Aborted",
            Category::FailedPrecondition => "FailedPrecondition",
            Category::ResourceExhausted => "ResourceExhausted",
        }
    }
}

/// One problem: where, a stable machine code, and a human reason (KubeVirt's wording where it
/// has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// JSON path of the offending field, e.g. `spec.template.spec.domain.memory.guest`
    /// (empty when the problem concerns the whole object).
    pub field: String,
    /// Stable reason code clients can match on, e.g. `FIRMWARE_UUID_TAKEN`.
    pub code: &'static str,
    /// What is wrong, for people. Never names an object of another namespace: that is
    /// [`Cause::holder`]'s, said only to a reader who may read it.
    pub reason: String,
    /// Another object in the way (the VM holding a firmware UUID), kept apart from `reason`.
    pub holder: Option<Holder>,
}

/// The object holding a unique value a command asked for (a firmware UUID's VM). It may be in
/// a namespace the requester cannot read, so a cause carries it apart from its reason, and
/// whoever words the cause for a reader ([`Rejection::describe_for`]) names it only when that
/// reader may read its namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its stream, e.g. `vm/imp/vm-cirros`.
    pub stream: String,
    /// Its namespace (from the stream), `None` when the stream names none.
    pub namespace: Option<String>,
    /// The cause's reason naming it (`firmware UUID … is already used by vm/imp/vm-cirros`).
    pub reason: String,
}

impl Cause {
    /// A cause at `field` with `code` and `reason`.
    pub fn new(field: impl Into<String>, code: &'static str, reason: impl Into<String>) -> Self {
        Cause {
            field: field.into(),
            code,
            reason: reason.into(),
            holder: None,
        }
    }

    /// The cause as said to a reader: its holder named when `may_name(holder's namespace)`.
    pub fn describe_for(&self, may_name: &dyn Fn(Option<&str>) -> bool) -> String {
        let reason = match &self.holder {
            Some(h) if may_name(h.namespace.as_deref()) => &h.reason,
            _ => &self.reason,
        };
        if self.field.is_empty() {
            reason.clone()
        } else {
            format!("{}: {reason}", self.field)
        }
    }
}

/// Names no holder: the wording safe for every reader.
impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe_for(&|_| false))
    }
}

/// A command refused: nothing is appended. Carries every cause found, not just the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Rejection {
    /// The category of the first (most important) cause.
    pub category: Category,
    /// Every problem found, in field order where that applies.
    pub causes: Vec<Cause>,
    /// For [`Category::Conflict`]: the object's actual generation.
    pub actual_generation: Option<u64>,
}

/// Names no holder (see [`Rejection::describe_for`]).
impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe_for(|_| false))
    }
}

impl Rejection {
    /// Every cause, `; `-separated, as said to a reader: a cause's [`Holder`] is named only
    /// when `may_name` allows its namespace (`None`: a holder whose stream names none).
    pub fn describe_for(&self, may_name: impl Fn(Option<&str>) -> bool) -> String {
        let parts: Vec<String> = self
            .causes
            .iter()
            .map(|c| c.describe_for(&may_name))
            .collect();
        parts.join("; ")
    }

    /// A rejection with one cause.
    pub fn one(category: Category, cause: Cause) -> Self {
        Rejection {
            category,
            causes: vec![cause],
            actual_generation: None,
        }
    }

    /// A rejection with many causes (must not be empty).
    pub fn many(category: Category, causes: Vec<Cause>) -> Self {
        debug_assert!(!causes.is_empty());
        Rejection {
            category,
            causes,
            actual_generation: None,
        }
    }

    /// Invalid input at `field`.
    pub fn invalid(
        field: impl Into<String>,
        code: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Self::one(Category::Invalid, Cause::new(field, code, reason))
    }

    /// A state-based refusal (KubeVirt's 409s).
    pub fn precondition(code: &'static str, reason: impl Into<String>) -> Self {
        Self::one(Category::FailedPrecondition, Cause::new("", code, reason))
    }

    /// The object does not exist.
    pub fn not_found(
        field: impl Into<String>,
        code: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Self::one(Category::NotFound, Cause::new(field, code, reason))
    }

    /// The expected generation is not the actual one.
    pub fn conflict(expected: u64, actual: u64) -> Self {
        Rejection {
            category: Category::Conflict,
            causes: vec![Cause::new(
                "metadata.generation",
                codes::GENERATION_CONFLICT,
                format!(
                    "the object has been modified: expected generation {expected}, actual {actual}"
                ),
            )],
            actual_generation: Some(actual),
        }
    }

    /// The object changed since the version the client read (`metadata.resourceVersion`, the
    /// position of its last event): an update made on that version would lose the change.
    pub fn stale(expected: u64, actual: u64) -> Self {
        Self::one(
            Category::Conflict,
            Cause::new(
                "metadata.resourceVersion",
                codes::RESOURCE_VERSION_CONFLICT,
                if actual == 0 {
                    format!(
                        "the object has been modified: expected resourceVersion {expected}, \
                         and it does not exist now"
                    )
                } else {
                    format!(
                        "the object has been modified: expected resourceVersion {expected}, \
                         actual {actual}; read it again and retry"
                    )
                },
            ),
        )
    }

    /// A manifest's `metadata.uid` (`expected`) that is not the live object's (`actual`):
    /// the object it was read from is gone and another took its name.
    pub fn uid_precondition(expected: uuid::Uuid, actual: Option<uuid::Uuid>) -> Self {
        Self::one(
            Category::Conflict,
            Cause::new(
                "metadata.uid",
                codes::UID_CONFLICT,
                match actual {
                    Some(actual) => format!(
                        "Precondition failed: UID in precondition: {expected}, UID in object \
                         meta: {actual} (the object the manifest was read from is gone and \
                         another took its name; remove metadata.uid to apply to this one)"
                    ),
                    None => format!("Precondition failed: UID in precondition: {expected}"),
                },
            ),
        )
    }

    /// Whether any cause has `code`.
    pub fn has_code(&self, code: &str) -> bool {
        self.causes.iter().any(|c| c.code == code)
    }

    /// The codes of all causes, in order.
    pub fn codes(&self) -> Vec<&'static str> {
        self.causes.iter().map(|c| c.code).collect()
    }
}

/// Collects causes during validation; turns into a [`Rejection`] if any were found.
#[derive(Debug, Default)]
pub struct Causes {
    category: Option<Category>,
    causes: Vec<Cause>,
}

impl Causes {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds an `Invalid` cause.
    pub fn invalid(
        &mut self,
        field: impl Into<String>,
        code: &'static str,
        reason: impl Into<String>,
    ) {
        self.push(Category::Invalid, Cause::new(field, code, reason));
    }
    /// Adds a cause of any category; the rejection takes the first category seen.
    pub fn push(&mut self, category: Category, cause: Cause) {
        self.category.get_or_insert(category);
        self.causes.push(cause);
    }
    /// Adds every cause of another rejection.
    pub fn extend(&mut self, r: Rejection) {
        self.category.get_or_insert(r.category);
        self.causes.extend(r.causes);
    }
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.causes.is_empty()
    }
    /// `Ok(())` when empty, else the rejection with every cause.
    pub fn finish(self) -> Result<(), Rejection> {
        match self.category {
            None => Ok(()),
            Some(category) => Err(Rejection::many(category, self.causes)),
        }
    }
}

/// Stable machine reason codes.
pub mod codes {
    /// A required field is missing.
    pub const REQUIRED: &str = "FIELD_REQUIRED";
    /// A value is not allowed.
    pub const INVALID_VALUE: &str = "FIELD_VALUE_INVALID";
    /// A value repeats where names must be unique.
    pub const DUPLICATE: &str = "FIELD_VALUE_DUPLICATE";
    /// A list or string is over a limit.
    pub const TOO_MANY: &str = "FIELD_VALUE_TOO_LONG";
    /// A reference names nothing.
    pub const NOT_FOUND_REF: &str = "FIELD_REFERENCE_NOT_FOUND";
    /// Not a Kubernetes quantity.
    pub const BAD_QUANTITY: &str = "QUANTITY_INVALID";
    /// The manifest could not be parsed.
    pub const PARSE: &str = "MANIFEST_PARSE_ERROR";
    /// The manifest is over a size or shape limit.
    pub const MANIFEST_TOO_LARGE: &str = "MANIFEST_TOO_LARGE";
    /// Unknown apiVersion/kind.
    pub const UNKNOWN_KIND: &str = "KIND_UNKNOWN";
    /// A kind vmplane parses but does not manage.
    pub const UNSUPPORTED_KIND: &str = "KIND_NOT_SUPPORTED";
    /// The firmware UUID is held by another live VM.
    pub const FIRMWARE_UUID_TAKEN: &str = "FIRMWARE_UUID_TAKEN";
    /// The firmware UUID is not a UUID.
    pub const FIRMWARE_UUID_INVALID: &str = "FIRMWARE_UUID_INVALID";
    /// `running` and `runStrategy` are both set.
    pub const RUNNING_AND_RUN_STRATEGY: &str = "RUNNING_AND_RUN_STRATEGY_EXCLUSIVE";
    /// Neither `running` nor `runStrategy`.
    pub const RUN_STRATEGY_REQUIRED: &str = "RUN_STRATEGY_REQUIRED";
    /// Unknown or unsupported run strategy.
    pub const RUN_STRATEGY_INVALID: &str = "RUN_STRATEGY_INVALID";
    /// A VM field conflicts with the instancetype.
    pub const INSTANCETYPE_CONFLICT: &str = "INSTANCETYPE_CONFLICT";
    /// The referenced instancetype was not provided/found.
    pub const INSTANCETYPE_NOT_FOUND: &str = "INSTANCETYPE_NOT_FOUND";
    /// The referenced preference was not provided/found.
    pub const PREFERENCE_NOT_FOUND: &str = "PREFERENCE_NOT_FOUND";
    /// A preference requirement is not met.
    pub const PREFERENCE_REQUIREMENT: &str = "PREFERENCE_REQUIREMENT_NOT_MET";
    /// The object exists already.
    pub const ALREADY_EXISTS: &str = "ALREADY_EXISTS";
    /// The object does not exist.
    pub const NOT_FOUND: &str = "NOT_FOUND";
    /// The object is being deleted (a VM Terminating while its VMI stops): it may not be
    /// created again, edited, started, stopped, restarted or snapshotted until it is gone.
    pub const BEING_DELETED: &str = "BEING_DELETED";
    /// Expected generation mismatch.
    pub const GENERATION_CONFLICT: &str = "GENERATION_CONFLICT";
    /// Expected resourceVersion mismatch: the object changed since it was read.
    pub const RESOURCE_VERSION_CONFLICT: &str = "RESOURCE_VERSION_CONFLICT";
    /// The manifest's `metadata.uid` is not the uid of the object living under its name.
    pub const UID_CONFLICT: &str = "UID_CONFLICT";
    /// metadata.name/namespace in the manifest differ from the command's target.
    pub const NAME_MISMATCH: &str = "NAME_MISMATCH";
    /// A start request KubeVirt would refuse with 409.
    pub const START_NOT_ALLOWED: &str = "START_NOT_ALLOWED";
    /// A stop request KubeVirt would refuse with 409.
    pub const STOP_NOT_ALLOWED: &str = "STOP_NOT_ALLOWED";
    /// A restart request KubeVirt would refuse with 409.
    pub const RESTART_NOT_ALLOWED: &str = "RESTART_NOT_ALLOWED";
    /// An observation about a VMI that is not the current one, or impossible in its phase.
    pub const STALE_OBSERVATION: &str = "VMI_OBSERVATION_STALE";
    /// The reconciler asked to launch a VMI when none is wanted.
    pub const LAUNCH_NOT_WANTED: &str = "VMI_LAUNCH_NOT_WANTED";
    /// A feature vmplane does not implement.
    pub const UNSUPPORTED: &str = "NOT_SUPPORTED";
    /// A feature gate name KubeVirt does not register.
    pub const FEATURE_GATE_UNKNOWN: &str = "FEATURE_GATE_UNKNOWN";
    /// A Discontinued feature gate is listed.
    pub const FEATURE_GATE_DISCONTINUED: &str = "FEATURE_GATE_DISCONTINUED";
    /// A gate is both enabled and disabled (both lists, or a list and its configurable).
    pub const FEATURE_GATE_CONFLICT: &str = "FEATURE_GATE_CONFLICT";
    /// A warning, not a rejection: a GA or Deprecated gate is listed.
    pub const FEATURE_GATE_REDUNDANT: &str = "FEATURE_GATE_REDUNDANT";
    /// A command or a VM needs a feature the cluster configuration has off.
    pub const FEATURE_NOT_ENABLED: &str = "FEATURE_NOT_ENABLED";
    /// The spec of a snapshot, restore or clone changed after creation (KubeVirt: "spec in
    /// immutable after creation").
    pub const SPEC_IMMUTABLE: &str = "SPEC_IMMUTABLE";
    /// A JSON patch of a restore or clone is malformed, unsupported or outside the paths it may
    /// touch.
    pub const PATCH_INVALID: &str = "PATCH_INVALID";
    /// The state the gateway passed does not belong to the object the spec names (e.g. a
    /// restore given the wrong snapshot stream): a caller bug.
    pub const INPUT_MISMATCH: &str = "INPUT_MISMATCH";
}
