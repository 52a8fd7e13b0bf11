//! Mapping of domain rejections and store errors to gRPC status codes: the one place where
//! `core` and `store` errors meet the wire.
//!
//! The message names the field path and the reason (`spec.template.spec.domain.memory.guest:
//! "2Gx" is not a quantity`); the stable machine-readable reason codes travel in the
//! `vmplane-reasons` metadata entry (comma-separated), the actual generation of a conflict in
//! `vmplane-actual-generation`.

use tonic::{Code, Status};
use vmplane_core::{Category, Rejection};

/// Metadata key carrying the rejection's stable reason codes.
pub const REASONS_KEY: &str = "vmplane-reasons";
/// Metadata key carrying the actual generation of a conflict.
pub const ACTUAL_GENERATION_KEY: &str = "vmplane-actual-generation";

/// The reason code of a read of an object at a revision it never had, or at which it did not
/// live (deleted then): the object itself may exist.
pub const REVISION_NOT_FOUND: &str = "REVISION_NOT_FOUND";

/// `status` with `reason` as its stable reason code ([`REASONS_KEY`]).
#[must_use]
pub fn with_reason(mut status: Status, reason: &'static str) -> Status {
    status.metadata_mut().insert(
        REASONS_KEY,
        tonic::metadata::MetadataValue::from_static(reason),
    );
    status
}

/// Whether `status` carries the stable reason code `reason`.
#[must_use]
pub fn has_reason(status: &Status, reason: &str) -> bool {
    status
        .metadata()
        .get(REASONS_KEY)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|r| r == reason))
}

/// The gRPC code for a rejection category.
pub fn code_for(category: Category) -> Code {
    match category {
        Category::Invalid => Code::InvalidArgument,
        Category::NotFound => Code::NotFound,
        Category::AlreadyExists => Code::AlreadyExists,
        Category::Conflict => Code::Aborted,
        Category::FailedPrecondition => Code::FailedPrecondition,
        Category::ResourceExhausted => Code::ResourceExhausted,
    }
}

/// A domain rejection as a gRPC status; `object` (e.g. `VirtualMachine default/demo`) prefixes
/// the message. Names no other object a cause carries ([`vmplane_core::Holder`]): see
/// [`from_rejection_for`].
pub fn from_rejection(object: &str, rejection: &Rejection) -> Status {
    from_rejection_for(object, rejection, |_| false)
}

/// [`from_rejection`] for a reader: a cause's holder (the VM holding a firmware UUID) is named
/// when `may_name(its namespace)`, else the cause says "another object", naming neither it nor
/// its namespace.
pub fn from_rejection_for(
    object: &str,
    rejection: &Rejection,
    may_name: impl Fn(Option<&str>) -> bool,
) -> Status {
    let said = rejection.describe_for(may_name);
    let message = if object.is_empty() {
        said
    } else {
        format!("{object}: {said}")
    };
    let mut status = Status::new(code_for(rejection.category), message);
    let reasons: Vec<&str> = rejection.causes.iter().map(|c| c.code).collect();
    if let Ok(v) = reasons.join(",").parse() {
        status.metadata_mut().insert(REASONS_KEY, v);
    }
    if let Some(actual) = rejection.actual_generation
        && let Ok(v) = actual.to_string().parse()
    {
        status.metadata_mut().insert(ACTUAL_GENERATION_KEY, v);
    }
    status
}

/// A store error met outside the command path (reads, watches, admin calls).
pub fn from_store(context: &str, err: &vmplane_store::Error) -> Status {
    use vmplane_store::Error as E;
    let message = format!("{context}: {err}");
    match err {
        E::LimitExceeded { .. } => Status::resource_exhausted(message),
        E::Conflict { .. } => Status::aborted(message),
        E::ClaimTaken { .. } => Status::already_exists(message),
        // The log's storage cannot answer now (etcd without a quorum, a poisoned log that must
        // be reopened): a client may retry later, with the same request id.
        E::Unavailable { .. } => Status::unavailable(message),
        // etcd's NOSPACE: refused before anything was committed.
        E::StorageFull { .. } => Status::resource_exhausted(message),
        // The server's log settings do not fit its storage; an operator must change them.
        E::Misconfigured { .. } => Status::failed_precondition(message),
        _ => Status::internal(message),
    }
}

/// The methods whose request carries a manifest (`Apply`, an import included, and `Expand` of
/// a manifest): only their oversized requests are told about the manifest's own limit.
const MANIFEST_METHODS: [&str; 2] = ["/vmplane.v1.Objects/Apply", "/vmplane.v1.Objects/Expand"];

/// tonic refuses a request above the server's message limit before any handler runs, as
/// `OUT_OF_RANGE` "Error, decoded message length too large: found N bytes, the limit is: M
/// bytes". vmplane's code for input over a size limit is `RESOURCE_EXHAUSTED` (a manifest just
/// over its own limit gets it from core): the same answer here, in vmplane's words. `path` is
/// the request's path (`/vmplane.v1.Objects/Apply`; the metrics' method label, which is the
/// path of every method served, will do): a request that carries a manifest is also told the
/// manifest's limit and what to do, any other only its size and the limit (the advice to split
/// a file means nothing to a `Get` whose name is 2 MB).
pub fn request_too_large(path: &str, headers: &mut http::HeaderMap) {
    let out_of_range = (tonic::Code::OutOfRange as i32).to_string();
    if headers.get("grpc-status").and_then(|v| v.to_str().ok()) != Some(out_of_range.as_str()) {
        return;
    }
    let Some(message) = headers.get("grpc-message").and_then(|v| v.to_str().ok()) else {
        return;
    };
    // grpc-message is percent-encoded; tonic's text has only spaces and ASCII to decode.
    let message = message.replace("%20", " ");
    if !message.contains("decoded message length too large") {
        return;
    }
    let numbers: Vec<&str> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .collect();
    let text = match numbers.as_slice() {
        [found, limit, ..] if MANIFEST_METHODS.contains(&path) => format!(
            "request: {found} bytes, more than the {limit} bytes a request may hold (a manifest \
             may be at most {} bytes; split the file into smaller objects)",
            vmplane_core::limits::MANIFEST_BYTES_MAX
        ),
        [found, limit, ..] => {
            format!("request: {found} bytes, more than the {limit} bytes a request may hold")
        }
        _ => "request: larger than a request may be".to_string(),
    };
    let code = (tonic::Code::ResourceExhausted as i32).to_string();
    if let (Ok(code), Ok(text)) = (
        http::HeaderValue::from_str(&code),
        http::HeaderValue::from_str(&text),
    ) {
        headers.insert("grpc-status", code);
        headers.insert("grpc-message", text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmplane_core::Cause;

    #[test]
    fn the_logs_storage_failures_map_to_what_a_client_can_act_on() {
        use vmplane_store::Error as E;
        let unavailable = E::Unavailable {
            reason: "etcd cluster [a] unavailable while reading the log's head".into(),
        };
        let full = E::StorageFull {
            reason: "etcd cluster [a] is out of space".into(),
        };
        let misconfigured = E::Misconfigured {
            reason: "--etcd-max-txn-ops exceeds a member's --max-txn-ops".into(),
        };
        for (err, code) in [
            (unavailable, Code::Unavailable),
            (full, Code::ResourceExhausted),
            (misconfigured, Code::FailedPrecondition),
        ] {
            let status = from_store("vm/default/a", &err);
            assert_eq!(status.code(), code, "{err}");
            assert!(
                status.message().starts_with("vm/default/a: "),
                "{}",
                status.message()
            );
        }
    }

    #[test]
    fn every_category_maps_to_its_grpc_code() {
        let cases = [
            (Category::Invalid, Code::InvalidArgument),
            (Category::NotFound, Code::NotFound),
            (Category::AlreadyExists, Code::AlreadyExists),
            (Category::Conflict, Code::Aborted),
            (Category::FailedPrecondition, Code::FailedPrecondition),
            (Category::ResourceExhausted, Code::ResourceExhausted),
        ];
        for (category, code) in cases {
            assert_eq!(code_for(category), code);
            assert_eq!(format!("{code:?}"), category.grpc_code_name());
        }
    }

    #[test]
    fn a_rejection_status_names_the_object_field_and_reason() {
        let r = Rejection::many(
            Category::Invalid,
            vec![
                Cause::new("spec.a", "FIELD_REQUIRED", "is required"),
                Cause::new("spec.b", "QUANTITY_INVALID", "\"2Gx\" is not a quantity"),
            ],
        );
        let s = from_rejection("VirtualMachine default/demo", &r);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(
            s.message(),
            "VirtualMachine default/demo: spec.a: is required; spec.b: \"2Gx\" is not a quantity"
        );
        assert_eq!(
            s.metadata().get(REASONS_KEY).and_then(|v| v.to_str().ok()),
            Some("FIELD_REQUIRED,QUANTITY_INVALID")
        );
    }

    #[test]
    fn a_firmware_uuid_holder_is_named_only_to_a_reader_of_its_namespace() {
        let r = Rejection::firmware_uuid_taken("0d2a", "vm/imp/vm-cirros");
        let object = "VirtualMachine team-a/vm-cirros";
        let named = from_rejection_for(object, &r, |ns| ns == Some("imp"));
        assert_eq!(named.code(), Code::AlreadyExists);
        assert!(
            named
                .message()
                .ends_with("is already used by vm/imp/vm-cirros"),
            "{}",
            named.message()
        );
        for hidden in [
            from_rejection_for(object, &r, |ns| ns == Some("team-a")),
            from_rejection(object, &r),
        ] {
            assert_eq!(hidden.code(), Code::AlreadyExists);
            assert!(
                hidden
                    .message()
                    .ends_with("is already used by another object")
                    && !hidden.message().contains("imp"),
                "{}",
                hidden.message()
            );
        }
    }

    /// Headers as tonic answers a request of `found` bytes over a `limit` of 1,114,112.
    fn refused_as_too_large(found: usize) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static("11"));
        let message = format!(
            "Error,%20decoded%20message%20length%20too%20large:%20found%20{found}%20bytes,\
             %20the%20limit%20is:%201114112%20bytes"
        );
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_str(&message).expect("ascii"),
        );
        headers
    }

    fn status_and_message(headers: &http::HeaderMap) -> (&str, &str) {
        let get = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        (get("grpc-status"), get("grpc-message"))
    }

    #[test]
    fn an_oversized_manifest_is_told_the_manifests_limit_and_to_split_the_file() {
        for path in ["/vmplane.v1.Objects/Apply", "/vmplane.v1.Objects/Expand"] {
            let mut headers = refused_as_too_large(2_000_000);
            request_too_large(path, &mut headers);
            let (code, message) = status_and_message(&headers);
            assert_eq!(code, "8", "{path}: RESOURCE_EXHAUSTED");
            assert_eq!(
                message,
                format!(
                    "request: 2000000 bytes, more than the 1114112 bytes a request may hold (a \
                     manifest may be at most {} bytes; split the file into smaller objects)",
                    vmplane_core::limits::MANIFEST_BYTES_MAX
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn an_oversized_request_without_a_manifest_is_told_its_size_and_the_limit_only() {
        for path in [
            "/vmplane.v1.Objects/Get",
            "/vmplane.v1.Lifecycle/Start",
            "/vmplane.v1.Cluster/FeatureUsage",
            "/grpc.health.v1.Health/Check",
            "unknown",
        ] {
            let mut headers = refused_as_too_large(2_000_000);
            request_too_large(path, &mut headers);
            assert_eq!(
                status_and_message(&headers),
                (
                    "8",
                    "request: 2000000 bytes, more than the 1114112 bytes a request may hold"
                ),
                "{path}"
            );
        }
        // Any other status passes untouched.
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", http::HeaderValue::from_static("5"));
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static("not%20found"),
        );
        request_too_large("/vmplane.v1.Objects/Get", &mut headers);
        assert_eq!(status_and_message(&headers), ("5", "not%20found"));
    }

    #[test]
    fn a_conflict_carries_the_actual_generation() {
        let s = from_rejection("VirtualMachine default/demo", &Rejection::conflict(2, 5));
        assert_eq!(s.code(), Code::Aborted);
        assert!(s.message().contains("actual 5"), "{}", s.message());
        assert_eq!(
            s.metadata()
                .get(ACTUAL_GENERATION_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("5")
        );
    }
}
