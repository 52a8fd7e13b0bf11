use serde::Deserialize;
use serde_json::Value;

use super::{
    GenericObject, Instancetype, ObjectMeta, Preference, VirtualMachine, VirtualMachineInstance,
};
use crate::error::{Category, Cause, Rejection, codes};
use crate::limits::{
    MANIFEST_BYTES_MAX, MANIFEST_DEPTH_MAX, MANIFEST_DOCUMENTS_MAX, MANIFEST_NODES_MAX,
    MANIFEST_STRING_BYTES_MAX,
};

/// Every kind vmplane parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `kubevirt.io/v1` VirtualMachine.
    VirtualMachine,
    /// `kubevirt.io/v1` VirtualMachineInstance.
    VirtualMachineInstance,
    /// `instancetype.kubevirt.io/v1beta1` VirtualMachineInstancetype (namespaced).
    VirtualMachineInstancetype,
    /// `instancetype.kubevirt.io/v1beta1` VirtualMachineClusterInstancetype.
    VirtualMachineClusterInstancetype,
    /// `instancetype.kubevirt.io/v1beta1` VirtualMachinePreference (namespaced).
    VirtualMachinePreference,
    /// `instancetype.kubevirt.io/v1beta1` VirtualMachineClusterPreference.
    VirtualMachineClusterPreference,
    /// `kubevirt.io/v1` KubeVirt: the cluster configuration.
    KubeVirt,
    /// `snapshot.kubevirt.io/v1beta1` VirtualMachineSnapshot.
    VirtualMachineSnapshot,
    /// `snapshot.kubevirt.io/v1beta1` VirtualMachineRestore.
    VirtualMachineRestore,
    /// `clone.kubevirt.io/v1beta1` VirtualMachineClone.
    VirtualMachineClone,
    /// `pool.kubevirt.io/v1beta1` VirtualMachinePool (parsed, not managed).
    VirtualMachinePool,
    /// `kubevirt.io/v1` VirtualMachineInstanceReplicaSet (parsed, not managed).
    VirtualMachineInstanceReplicaSet,
    /// `kubevirt.io/v1` VirtualMachineInstanceMigration (parsed, not managed).
    VirtualMachineInstanceMigration,
}

impl Kind {
    /// Every kind, in this order.
    pub const ALL: [Kind; 13] = [
        Kind::VirtualMachine,
        Kind::VirtualMachineInstance,
        Kind::VirtualMachineInstancetype,
        Kind::VirtualMachineClusterInstancetype,
        Kind::VirtualMachinePreference,
        Kind::VirtualMachineClusterPreference,
        Kind::KubeVirt,
        Kind::VirtualMachineSnapshot,
        Kind::VirtualMachineRestore,
        Kind::VirtualMachineClone,
        Kind::VirtualMachinePool,
        Kind::VirtualMachineInstanceReplicaSet,
        Kind::VirtualMachineInstanceMigration,
    ];

    /// The `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "VirtualMachine",
            Kind::VirtualMachineInstance => "VirtualMachineInstance",
            Kind::VirtualMachineInstancetype => "VirtualMachineInstancetype",
            Kind::VirtualMachineClusterInstancetype => "VirtualMachineClusterInstancetype",
            Kind::VirtualMachinePreference => "VirtualMachinePreference",
            Kind::VirtualMachineClusterPreference => "VirtualMachineClusterPreference",
            Kind::KubeVirt => "KubeVirt",
            Kind::VirtualMachineSnapshot => "VirtualMachineSnapshot",
            Kind::VirtualMachineRestore => "VirtualMachineRestore",
            Kind::VirtualMachineClone => "VirtualMachineClone",
            Kind::VirtualMachinePool => "VirtualMachinePool",
            Kind::VirtualMachineInstanceReplicaSet => "VirtualMachineInstanceReplicaSet",
            Kind::VirtualMachineInstanceMigration => "VirtualMachineInstanceMigration",
        }
    }

    /// The API group.
    pub fn group(self) -> &'static str {
        match self {
            Kind::VirtualMachine
            | Kind::VirtualMachineInstance
            | Kind::KubeVirt
            | Kind::VirtualMachineInstanceReplicaSet
            | Kind::VirtualMachineInstanceMigration => "kubevirt.io",
            Kind::VirtualMachineInstancetype
            | Kind::VirtualMachineClusterInstancetype
            | Kind::VirtualMachinePreference
            | Kind::VirtualMachineClusterPreference => "instancetype.kubevirt.io",
            Kind::VirtualMachineSnapshot | Kind::VirtualMachineRestore => "snapshot.kubevirt.io",
            Kind::VirtualMachineClone => "clone.kubevirt.io",
            Kind::VirtualMachinePool => "pool.kubevirt.io",
        }
    }

    /// API versions accepted for this kind (the first is the one vmplane writes).
    pub fn versions(self) -> &'static [&'static str] {
        match self.group() {
            // v1alpha3 is still served by KubeVirt, deprecated; read as v1
            // ([`deprecated_api_version`]).
            "kubevirt.io" => &["v1", "v1alpha3"],
            "instancetype.kubevirt.io" => &["v1beta1"],
            "snapshot.kubevirt.io" => &["v1beta1", "v1alpha1"],
            "clone.kubevirt.io" => &["v1beta1", "v1alpha1"],
            _ => &["v1beta1", "v1alpha1"],
        }
    }

    /// `group/version` vmplane writes.
    pub fn api_version(self) -> String {
        format!("{}/{}", self.group(), self.versions()[0])
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::VirtualMachineClusterInstancetype | Kind::VirtualMachineClusterPreference
        )
    }

    /// Whether access to objects of this kind is decided for the whole cluster, not per
    /// namespace: the cluster-scoped kinds, and `KubeVirt`, the cluster configuration. A
    /// KubeVirt manifest names a namespace (KubeVirt's own, `kubevirt`), but vmplane holds one
    /// cluster config whatever namespace it names (stream `cluster/config`): every
    /// authenticated principal reads it, only an admin changes it.
    pub fn cluster_wide(self) -> bool {
        !self.namespaced() || self == Kind::KubeVirt
    }

    /// Whether vmplane manages objects of this kind (has an aggregate for it).
    pub fn managed(self) -> bool {
        !matches!(
            self,
            Kind::VirtualMachinePool
                | Kind::VirtualMachineInstanceReplicaSet
                | Kind::VirtualMachineInstanceMigration
        )
    }

    /// The kind for an `apiVersion` and `kind` pair, if vmplane knows it.
    pub fn from_api(api_version: &str, kind: &str) -> Option<Kind> {
        let (group, version) = api_version.split_once('/')?;
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group() == group && k.versions().contains(&version))
    }
}

/// The `apiVersion`s KubeVirt still serves but has deprecated, each with its deprecation
/// warning (KubeVirt's CRD `deprecationWarning`, word for word). vmplane reads them as the
/// kind's current version: the object is stored, shown and compared as `kubevirt.io/v1`.
pub const DEPRECATED_API_VERSIONS: [(&str, &str); 1] = [(
    "kubevirt.io/v1alpha3",
    "kubevirt.io/v1alpha3 is now deprecated and will be removed in a future release.",
)];

/// KubeVirt's warning for a manifest written in `api_version`, if that version is deprecated
/// (`kubevirt.io/v1alpha3`), for the gateway to send back with an accepted apply.
#[must_use]
pub fn deprecated_api_version(api_version: &str) -> Option<String> {
    DEPRECATED_API_VERSIONS
        .iter()
        .find(|(v, _)| *v == api_version)
        .map(|(_, warning)| (*warning).to_owned())
}

impl Kind {
    /// The kind for one of kubectl's names (`vm`, `vms`, `virtualmachine(s)`, `vmi`,
    /// `instancetype`, `clusterinstancetype`, `preference`, `clusterpreference`, `snapshot`,
    /// `restore`, `clone`, `kubevirt`, …), case-insensitive.
    pub fn from_cli_name(name: &str) -> Option<Kind> {
        let lower = name.to_ascii_lowercase();
        Self::from_singular(&lower).or_else(|| Self::from_singular(lower.strip_suffix('s')?))
    }

    fn from_singular(n: &str) -> Option<Kind> {
        Some(match n {
            "vm" | "virtualmachine" => Kind::VirtualMachine,
            "vmi" | "virtualmachineinstance" => Kind::VirtualMachineInstance,
            "instancetype" | "vminstancetype" | "virtualmachineinstancetype" => {
                Kind::VirtualMachineInstancetype
            }
            "clusterinstancetype"
            | "vmclusterinstancetype"
            | "virtualmachineclusterinstancetype" => Kind::VirtualMachineClusterInstancetype,
            "preference" | "vmpref" | "virtualmachinepreference" => Kind::VirtualMachinePreference,
            "clusterpreference" | "vmcpref" | "virtualmachineclusterpreference" => {
                Kind::VirtualMachineClusterPreference
            }
            "snapshot" | "vmsnapshot" | "virtualmachinesnapshot" => Kind::VirtualMachineSnapshot,
            "restore" | "vmrestore" | "virtualmachinerestore" => Kind::VirtualMachineRestore,
            "clone" | "vmclone" | "virtualmachineclone" => Kind::VirtualMachineClone,
            "kubevirt" | "kv" => Kind::KubeVirt,
            "pool" | "vmpool" | "virtualmachinepool" => Kind::VirtualMachinePool,
            "vmirs" | "virtualmachineinstancereplicaset" => Kind::VirtualMachineInstanceReplicaSet,
            "vmim" | "virtualmachineinstancemigration" => Kind::VirtualMachineInstanceMigration,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Any object vmplane parses, dispatched on `apiVersion` + `kind`.
#[derive(Debug, Clone, PartialEq)]
pub enum Manifest {
    /// A VirtualMachine.
    VirtualMachine(Box<VirtualMachine>),
    /// A VirtualMachineInstance.
    VirtualMachineInstance(Box<VirtualMachineInstance>),
    /// A namespaced or cluster instancetype (see its `kind`).
    Instancetype(Box<Instancetype>),
    /// A namespaced or cluster preference (see its `kind`).
    Preference(Box<Preference>),
    /// Any other kind vmplane knows (KubeVirt, snapshot, restore, clone, pool, …).
    Object(Kind, Box<GenericObject>),
}

/// Why input could not be parsed into manifests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The input is larger than [`MANIFEST_BYTES_MAX`]; nothing was parsed.
    #[error("manifest is {bytes} bytes, more than the limit of {bytes_max} bytes")]
    TooLarge {
        /// Size of the input.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// More documents than [`MANIFEST_DOCUMENTS_MAX`].
    #[error("more than {documents_max} documents in one file")]
    TooManyDocuments {
        /// The limit.
        documents_max: usize,
    },
    /// A document nests deeper than [`MANIFEST_DEPTH_MAX`], or expands (through YAML aliases)
    /// to more than [`MANIFEST_NODES_MAX`] nodes, or has an over-long string.
    #[error("document {document}: {what}")]
    TooComplex {
        /// Index of the document (0-based).
        document: usize,
        /// What limit was hit.
        what: String,
    },
    /// Not YAML/JSON.
    #[error("document {document}: {message}")]
    Syntax {
        /// Index of the document.
        document: usize,
        /// The parser's message.
        message: String,
    },
    /// A document without `apiVersion` or `kind`, or not a map.
    #[error("document {document}: {field}: Required value")]
    Missing {
        /// Index of the document.
        document: usize,
        /// `apiVersion` or `kind`.
        field: &'static str,
    },
    /// An `apiVersion`/`kind` vmplane does not know.
    #[error("document {document}: no kind \"{kind}\" is registered for version \"{api_version}\"")]
    UnknownKind {
        /// Index of the document.
        document: usize,
        /// The apiVersion given.
        api_version: String,
        /// The kind given.
        kind: String,
    },
    /// A field of a known kind has the wrong shape.
    #[error("document {document}: {path}: {message}")]
    Field {
        /// Index of the document.
        document: usize,
        /// JSON path of the field.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl ParseError {
    /// The field path this error concerns ("" when none).
    pub fn field(&self) -> String {
        match self {
            ParseError::Missing { field, .. } => (*field).to_owned(),
            ParseError::UnknownKind { .. } => "kind".to_owned(),
            ParseError::Field { path, .. } => path.clone(),
            _ => String::new(),
        }
    }
}

impl From<ParseError> for Rejection {
    fn from(e: ParseError) -> Self {
        let (category, code) = match &e {
            ParseError::TooLarge { .. }
            | ParseError::TooManyDocuments { .. }
            | ParseError::TooComplex { .. } => {
                (Category::ResourceExhausted, codes::MANIFEST_TOO_LARGE)
            }
            ParseError::UnknownKind { .. } => (Category::Invalid, codes::UNKNOWN_KIND),
            ParseError::Field { message, .. } if message.contains("is not a quantity") => {
                (Category::Invalid, codes::BAD_QUANTITY)
            }
            _ => (Category::Invalid, codes::PARSE),
        };
        // The cause carries the field path; its reason must not say it (nor the document
        // number, which is the caller's to give: one manifest is parsed alone) a second time.
        let reason = match &e {
            ParseError::Field { message, .. } => message.clone(),
            ParseError::Missing { .. } => "Required value".to_owned(),
            ParseError::UnknownKind {
                api_version, kind, ..
            } => format!("no kind \"{kind}\" is registered for version \"{api_version}\""),
            other => other.to_string(),
        };
        Rejection::one(category, Cause::new(e.field(), code, reason))
    }
}

/// Nesting of flow collections above which a file is refused before it is parsed (a generous
/// multiple of [`MANIFEST_DEPTH_MAX`]: brackets inside plain scalars and block scalars, such as
/// shell tests in cloud-init user data, count too).
pub const FLOW_DEPTH_PRESCAN_MAX: usize = 4 * MANIFEST_DEPTH_MAX;

/// `Some(limit)` if `[`/`{` nest deeper than `limit` outside quoted strings and comments: one
/// pass, no allocation.
fn flow_depth_over(text: &str, limit: usize) -> Option<usize> {
    let (mut depth, mut quote, mut escaped, mut comment, mut prev) =
        (0usize, None::<u8>, false, false, b'\n');
    for &b in text.as_bytes() {
        if comment {
            comment = b != b'\n';
        } else if let Some(q) = quote {
            if q == b'"' && escaped {
                escaped = false;
            } else if q == b'"' && b == b'\\' {
                escaped = true;
            } else if b == q {
                quote = None;
            }
        } else {
            match b {
                b'"' | b'\''
                    if matches!(prev, b' ' | b'\t' | b'\n' | b'[' | b'{' | b',' | b':') =>
                {
                    quote = Some(b)
                }
                b'#' if matches!(prev, b' ' | b'\t' | b'\n') => comment = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > limit {
                        return Some(limit);
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        prev = b;
    }
    None
}

/// Whether `[`/`{` nest deeper than `limit` outside the strings of a JSON text: what
/// [`flow_depth_over`] says of valid JSON (which has no comments and no single quotes), with
/// less to decide per byte: a string is skipped to its closing quote without looking at what
/// it holds. On invalid JSON the answer means nothing, and the text's parse fails anyway.
fn json_depth_over(text: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'"' => {
                while let Some(&c) = bytes.next() {
                    match c {
                        b'"' => break,
                        b'\\' => {
                            bytes.next();
                        }
                        _ => {}
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Parses a YAML or JSON file of one or more documents into raw JSON values, enforcing every
/// limit: the byte size is checked before anything is parsed; nesting depth, node count (after
/// alias expansion) and string lengths after. Empty documents are skipped.
pub fn parse_documents(input: &[u8]) -> Result<Vec<Value>, ParseError> {
    if input.len() > MANIFEST_BYTES_MAX {
        return Err(ParseError::TooLarge {
            bytes: input.len(),
            bytes_max: MANIFEST_BYTES_MAX,
        });
    }
    let text = std::str::from_utf8(input).map_err(|e| ParseError::Syntax {
        document: 0,
        message: format!("not UTF-8: {e}"),
    })?;
    // serde_yaml's cost grows with the square of flow-collection nesting and its own limit
    // applies only after it has read everything: refuse deep `[`/`{` nesting in one linear pass
    // first (the precise depth limit is checked on the parsed value below).
    if let Some(depth) = flow_depth_over(text, FLOW_DEPTH_PRESCAN_MAX) {
        return Err(ParseError::TooComplex {
            document: 0,
            what: format!(
                "flow collections ([ ] or {{ }}) nested deeper than the limit of \
                 {MANIFEST_DEPTH_MAX} levels (more than {depth} found)"
            ),
        });
    }
    let first = text.trim_start().chars().next();
    let mut docs = Vec::new();
    if matches!(first, Some('{') | Some('[')) {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (i, doc) in stream.by_ref().enumerate() {
            if i >= MANIFEST_DOCUMENTS_MAX {
                return Err(ParseError::TooManyDocuments {
                    documents_max: MANIFEST_DOCUMENTS_MAX,
                });
            }
            let v = doc.map_err(|e| ParseError::Syntax {
                document: i,
                message: e.to_string(),
            })?;
            check_shape(i, &v)?;
            docs.push(v);
        }
    } else {
        for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
            if i >= MANIFEST_DOCUMENTS_MAX {
                return Err(ParseError::TooManyDocuments {
                    documents_max: MANIFEST_DOCUMENTS_MAX,
                });
            }
            let v = Value::deserialize(de).map_err(|e| {
                let message = e.to_string();
                if message.contains("recursion limit") || message.contains("repetition limit") {
                    ParseError::TooComplex {
                        document: i,
                        what: message,
                    }
                } else {
                    ParseError::Syntax {
                        document: i,
                        message,
                    }
                }
            })?;
            if v.is_null() {
                continue;
            }
            check_shape(i, &v)?;
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Parses a YAML or JSON file into typed manifests (see [`parse_documents`] for the limits).
pub fn parse_manifests(input: &[u8]) -> Result<Vec<Manifest>, ParseError> {
    parse_documents(input)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| Manifest::from_value_at(i, v))
        .collect()
}

/// Parses exactly one manifest.
///
/// A small JSON object (what gRPC clients and the load generator send) is read straight into
/// its type, without the JSON tree and the path-tracking layer (about half the time). Whenever
/// that fast reading cannot give exactly what the general path gives, the general path runs:
/// so the result, and every error with its field path, is the general path's.
pub fn parse_manifest(input: &[u8]) -> Result<Manifest, ParseError> {
    match std::str::from_utf8(input).ok().and_then(parse_json_fast) {
        Some(manifest) => Ok(manifest),
        None => parse_manifest_general(input),
    }
}

/// [`parse_manifest`] through the JSON tree, for any input.
fn parse_manifest_general(input: &[u8]) -> Result<Manifest, ParseError> {
    let mut all = parse_manifests(input)?;
    match all.len() {
        1 => Ok(all.remove(0)),
        n => Err(ParseError::Syntax {
            document: 0,
            message: format!("expected one document, found {n}"),
        }),
    }
}

/// Largest input [`parse_json_fast`] reads: a JSON text of this many bytes cannot hold more
/// nodes than [`MANIFEST_NODES_MAX`] (each takes at least a byte) nor a string or key longer than
/// [`MANIFEST_STRING_BYTES_MAX`], so only the depth limit is left to check.
const FAST_JSON_BYTES_MAX: usize = if MANIFEST_NODES_MAX < MANIFEST_STRING_BYTES_MAX {
    MANIFEST_NODES_MAX
} else {
    MANIFEST_STRING_BYTES_MAX
};

/// `apiVersion` and `kind`, borrowed from the text (a value with escapes is not borrowable:
/// the general path takes it).
#[derive(Deserialize)]
struct TypeHeader<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
}

/// One JSON object read straight into its type, or `None` to leave it to the general path
/// ([`parse_documents`] + [`Manifest::from_value`]), which then gives the same result or the
/// error with its field path. `None` whenever the two could differ:
/// - not one small JSON object: over [`FAST_JSON_BYTES_MAX`] (the node and string limits),
///   brackets nested deeper than the depth limit allows, not starting with `{`, or trailing
///   input (a second document);
/// - no string `apiVersion` and `kind`, or a kind vmplane does not know;
/// - any error from the typed reading, including a key given twice in one object (the JSON
///   tree keeps the last, a typed struct refuses it; maps keep the last either way).
fn parse_json_fast(text: &str) -> Option<Manifest> {
    if text.len() > FAST_JSON_BYTES_MAX || !text.trim_start().starts_with('{') {
        return None;
    }
    // A scalar sits one level below its object: brackets nested at most one less than the
    // limit keep every node within it (the count is exact for valid JSON; invalid JSON fails
    // below).
    if json_depth_over(text.as_bytes(), MANIFEST_DEPTH_MAX - 1) {
        return None;
    }
    let header: TypeHeader<'_> = serde_json::from_str(text).ok()?;
    let kind = Kind::from_api(header.api_version, header.kind)?;
    Manifest::of_kind(kind, JsonText(text)).ok()
}

/// Where [`Manifest::of_kind`] reads the typed object from.
trait TypedSource {
    type Error;
    fn typed<T: serde::de::DeserializeOwned>(self) -> Result<T, Self::Error>;
}

/// A parsed document (the general path): errors carry the field path.
struct ParsedDocument {
    document: usize,
    value: Value,
}

impl TypedSource for ParsedDocument {
    type Error = ParseError;
    fn typed<T: serde::de::DeserializeOwned>(self) -> Result<T, ParseError> {
        typed(self.document, self.value)
    }
}

/// JSON text read straight into the type (the fast path): errors are only a signal to take
/// the general path.
struct JsonText<'a>(&'a str);

impl TypedSource for JsonText<'_> {
    type Error = serde_json::Error;
    fn typed<T: serde::de::DeserializeOwned>(self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0)
    }
}

/// Checks depth, node count and string lengths without recursion.
fn check_shape(document: usize, root: &Value) -> Result<(), ParseError> {
    let complex = |what: String| ParseError::TooComplex { document, what };
    let mut nodes = 0usize;
    let mut stack: Vec<(&Value, usize)> = vec![(root, 1)];
    while let Some((v, depth)) = stack.pop() {
        nodes += 1;
        if nodes > MANIFEST_NODES_MAX {
            return Err(complex(format!("more than {MANIFEST_NODES_MAX} nodes")));
        }
        if depth > MANIFEST_DEPTH_MAX {
            return Err(complex(format!(
                "nested deeper than {MANIFEST_DEPTH_MAX} levels"
            )));
        }
        match v {
            Value::String(s) if s.len() > MANIFEST_STRING_BYTES_MAX => {
                return Err(complex(format!(
                    "a string is longer than {MANIFEST_STRING_BYTES_MAX} bytes"
                )));
            }
            Value::Array(items) => stack.extend(items.iter().map(|x| (x, depth + 1))),
            Value::Object(map) => {
                for (k, x) in map {
                    if k.len() > MANIFEST_STRING_BYTES_MAX {
                        return Err(complex(format!(
                            "a key is longer than {MANIFEST_STRING_BYTES_MAX} bytes"
                        )));
                    }
                    stack.push((x, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn typed<T: serde::de::DeserializeOwned>(document: usize, v: Value) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        ParseError::Field {
            document,
            path: if path == "." { String::new() } else { path },
            message: e.into_inner().to_string(),
        }
    })
}

impl Manifest {
    /// Dispatches a parsed document on `apiVersion` + `kind`.
    pub fn from_value(v: Value) -> Result<Manifest, ParseError> {
        Self::from_value_at(0, v)
    }

    fn from_value_at(document: usize, v: Value) -> Result<Manifest, ParseError> {
        let Some(obj) = v.as_object() else {
            return Err(ParseError::Syntax {
                document,
                message: "a manifest must be a map".into(),
            });
        };
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .ok_or(ParseError::Missing {
                document,
                field: "apiVersion",
            })?
            .to_owned();
        let kind_str = obj
            .get("kind")
            .and_then(Value::as_str)
            .ok_or(ParseError::Missing {
                document,
                field: "kind",
            })?
            .to_owned();
        let kind = Kind::from_api(&api_version, &kind_str).ok_or(ParseError::UnknownKind {
            document,
            api_version,
            kind: kind_str,
        })?;
        Self::of_kind(kind, ParsedDocument { document, value: v })
    }

    /// The typed object of `kind`, read from `source`, its `apiVersion` the kind's current one
    /// when it was written in a deprecated version ([`DEPRECATED_API_VERSIONS`]).
    fn of_kind<S: TypedSource>(kind: Kind, source: S) -> Result<Manifest, S::Error> {
        let mut manifest = Self::typed_of_kind(kind, source)?;
        manifest.upgrade_api_version(kind);
        Ok(manifest)
    }

    /// Sets a deprecated `apiVersion` to `kind`'s current one.
    fn upgrade_api_version(&mut self, kind: Kind) {
        let api_version = match self {
            Manifest::VirtualMachine(o) => &mut o.api_version,
            Manifest::VirtualMachineInstance(o) => &mut o.api_version,
            Manifest::Instancetype(o) => &mut o.api_version,
            Manifest::Preference(o) => &mut o.api_version,
            Manifest::Object(_, o) => &mut o.api_version,
        };
        if DEPRECATED_API_VERSIONS
            .iter()
            .any(|(v, _)| *v == api_version.as_str())
        {
            *api_version = kind.api_version();
        }
    }

    fn typed_of_kind<S: TypedSource>(kind: Kind, source: S) -> Result<Manifest, S::Error> {
        Ok(match kind {
            Kind::VirtualMachine => Manifest::VirtualMachine(Box::new(source.typed()?)),
            Kind::VirtualMachineInstance => {
                Manifest::VirtualMachineInstance(Box::new(source.typed()?))
            }
            Kind::VirtualMachineInstancetype | Kind::VirtualMachineClusterInstancetype => {
                Manifest::Instancetype(Box::new(source.typed()?))
            }
            Kind::VirtualMachinePreference | Kind::VirtualMachineClusterPreference => {
                Manifest::Preference(Box::new(source.typed()?))
            }
            other => Manifest::Object(other, Box::new(source.typed()?)),
        })
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        match self {
            Manifest::VirtualMachine(_) => Kind::VirtualMachine,
            Manifest::VirtualMachineInstance(_) => Kind::VirtualMachineInstance,
            Manifest::Instancetype(o) => Kind::from_api(&o.api_version, &o.kind)
                .unwrap_or(Kind::VirtualMachineClusterInstancetype),
            Manifest::Preference(o) => Kind::from_api(&o.api_version, &o.kind)
                .unwrap_or(Kind::VirtualMachineClusterPreference),
            Manifest::Object(k, _) => *k,
        }
    }

    /// The metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Manifest::VirtualMachine(o) => &o.metadata,
            Manifest::VirtualMachineInstance(o) => &o.metadata,
            Manifest::Instancetype(o) => &o.metadata,
            Manifest::Preference(o) => &o.metadata,
            Manifest::Object(_, o) => &o.metadata,
        }
    }

    /// The metadata, to fill in what the request implies (a default namespace).
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Manifest::VirtualMachine(o) => &mut o.metadata,
            Manifest::VirtualMachineInstance(o) => &mut o.metadata,
            Manifest::Instancetype(o) => &mut o.metadata,
            Manifest::Preference(o) => &mut o.metadata,
            Manifest::Object(_, o) => &mut o.metadata,
        }
    }

    /// The object as a JSON value, in KubeVirt's shape.
    pub fn to_value(&self) -> Value {
        let r = match self {
            Manifest::VirtualMachine(o) => serde_json::to_value(o),
            Manifest::VirtualMachineInstance(o) => serde_json::to_value(o),
            Manifest::Instancetype(o) => serde_json::to_value(o),
            Manifest::Preference(o) => serde_json::to_value(o),
            Manifest::Object(_, o) => serde_json::to_value(o),
        };
        // Serializing these types to a Value cannot fail: every map key is a string.
        r.unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod flow_depth_tests {
    use super::*;

    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        let deep = format!("a: {}{}", "[".repeat(100_000), "]".repeat(100_000));
        match parse_documents(deep.as_bytes()) {
            Err(ParseError::TooComplex { what, .. }) => assert!(what.contains("flow"), "{what}"),
            other => panic!("expected TooComplex, got {other:?}"),
        }
    }

    #[test]
    fn brackets_in_strings_comments_and_scripts_do_not_count() {
        let many = "[".repeat(FLOW_DEPTH_PRESCAN_MAX + 10);
        let yaml = format!("a: \"{many}\"\nb: '{many}'\n# {many}\nc: [1, [2, {{d: 3}}]]\n");
        assert_eq!(flow_depth_over(&yaml, FLOW_DEPTH_PRESCAN_MAX), None);
        assert!(parse_documents(yaml.as_bytes()).is_ok());
        let at_limit = format!(
            "{}{}",
            "[".repeat(FLOW_DEPTH_PRESCAN_MAX),
            "]".repeat(FLOW_DEPTH_PRESCAN_MAX)
        );
        assert_eq!(flow_depth_over(&at_limit, FLOW_DEPTH_PRESCAN_MAX), None);
        let over = format!("[{at_limit}]");
        assert_eq!(
            flow_depth_over(&over, FLOW_DEPTH_PRESCAN_MAX),
            Some(FLOW_DEPTH_PRESCAN_MAX)
        );
    }
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn a_parse_rejection_names_its_field_path_once() {
        let cases = [
            (
                "kind: VirtualMachine\nmetadata: {name: a}\n",
                "apiVersion: Required value",
            ),
            (
                "apiVersion: kubevirt.io/v1\nmetadata: {name: a}\n",
                "kind: Required value",
            ),
            (
                "apiVersion: v1\nkind: Gadget\n",
                "kind: no kind \"Gadget\" is registered for version \"v1\"",
            ),
        ];
        for (yaml, expected) in cases {
            let err = parse_manifest(yaml.as_bytes()).expect_err("refused");
            let rejection = Rejection::from(err);
            assert_eq!(rejection.to_string(), expected, "{yaml}");
            assert_eq!(
                rejection.causes[0].field,
                expected.split(':').next().unwrap_or_default()
            );
        }
    }
}

#[cfg(test)]
mod fast_json_tests {
    use super::*;

    fn general(text: &str) -> Result<Manifest, ParseError> {
        parse_manifest_general(text.as_bytes())
    }

    const VM: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"vm-1","namespace":"load","labels":{"app":"x"}},"spec":{"runStrategy":"Halted","template":{"spec":{"domain":{"cpu":{"cores":1},"memory":{"guest":"128Mi"},"devices":{"disks":[{"name":"root","disk":{"bus":"virtio"}}]}},"volumes":[{"name":"root","containerDisk":{"image":"quay.io/containerdisks/fedora:40"}}]}}}}"#;

    #[test]
    fn a_small_json_object_is_read_straight_into_what_the_general_path_gives() {
        let instancetype = r#"{"apiVersion":"instancetype.kubevirt.io/v1beta1","kind":"VirtualMachineClusterInstancetype","metadata":{"name":"u1.small"},"spec":{"cpu":{"guest":1},"memory":{"guest":"2Gi"}}}"#;
        let kubevirt = r#"{"apiVersion":"kubevirt.io/v1","kind":"KubeVirt","metadata":{"name":"kubevirt","namespace":"kubevirt"},"spec":{"configuration":{"developerConfiguration":{"featureGates":["Snapshot"]}}}}"#;
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<Value>(VM).unwrap()).unwrap();
        for text in [VM, instancetype, kubevirt, &format!("  \n{pretty}\n")] {
            let fast = parse_json_fast(text).unwrap_or_else(|| panic!("not read fast: {text}"));
            assert_eq!(fast, general(text).unwrap(), "{text}");
            assert_eq!(parse_manifest(text.as_bytes()).unwrap(), fast);
        }
    }

    /// Any JSON value, nested up to 24 deep, with strings full of brackets, quotes,
    /// backslashes and comment signs.
    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = "[\\[\\]{}\"'\\\\#a :,\n]{0,10}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            text.prop_map(Value::from),
        ];
        leaf.prop_recursive(24, 200, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text, inner), 0..4)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_json_depth_scan_says_what_the_general_scan_says_of_any_json(
            value in any_json(),
            pretty in proptest::bool::ANY,
            limit in 0usize..16,
        ) {
            let text = if pretty {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            }
            .expect("a JSON value serializes");
            proptest::prop_assert_eq!(
                json_depth_over(text.as_bytes(), limit),
                flow_depth_over(&text, limit).is_some(),
                "{}", text
            );
        }
    }

    #[test]
    fn what_the_two_paths_could_read_differently_is_left_to_the_general_path() {
        let nested = |brackets: usize| {
            // `metadata.annotations` is a map of strings: nesting under it is a type error
            // for both paths, so the depth limit decides which error comes first.
            format!(
                r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"a","annotations":{}"x"{}}}}}"#,
                "[".repeat(brackets - 3),
                "]".repeat(brackets - 3)
            )
        };
        let cases = [
            // A key given twice: the tree keeps the last, a typed struct refuses it.
            VM.replace(r#""name":"vm-1""#, r#""name":"vm-1","name":"vm-2""#),
            // A field of the wrong type: the error must carry the general path's field path.
            VM.replace(r#""cores":1"#, r#""cores":"one""#),
            // Two documents.
            format!("{VM}\n{VM}"),
            // Not an object.
            format!("[{VM}]"),
            // An unknown kind, a missing kind, an escaped apiVersion.
            VM.replace(r#""kind":"VirtualMachine""#, r#""kind":"Gadget""#),
            VM.replace(r#""kind":"VirtualMachine","#, ""),
            VM.replace("kubevirt.io/v1", r"kubevirt.io\/v1"),
            // Brackets nested to one below the depth limit (a type error under `annotations`)
            // and to the limit (a scalar one deeper: refused as too deep).
            nested(MANIFEST_DEPTH_MAX),
            nested(MANIFEST_DEPTH_MAX + 1),
            // Larger than the node limit can be exceeded by.
            VM.replace(
                r#""app":"x""#,
                &format!(r#""app":"{}""#, "x".repeat(FAST_JSON_BYTES_MAX)),
            ),
        ];
        for text in &cases {
            assert!(parse_json_fast(text).is_none(), "read fast: {text:.200}");
            assert_eq!(
                parse_manifest(text.as_bytes()),
                general(text),
                "{text:.200}"
            );
        }
        // The same results as before the fast path, spelled out.
        assert_eq!(
            parse_manifest(cases[0].as_bytes())
                .unwrap()
                .metadata()
                .name_str(),
            "vm-2"
        );
        match parse_manifest(cases[1].as_bytes()) {
            Err(ParseError::Field { path, .. }) => {
                assert_eq!(path, "spec.template.spec.domain.cpu.cores")
            }
            other => panic!("expected a field error, got {other:?}"),
        }
        assert!(matches!(
            parse_manifest(cases[8].as_bytes()),
            Err(ParseError::TooComplex { .. })
        ));
        assert!(parse_manifest(cases[9].as_bytes()).is_ok());
    }
}
