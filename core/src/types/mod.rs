//! KubeVirt's object types, in KubeVirt's JSON/YAML shape.
//!
//! Fields vmplane interprets are typed; every other field is kept in an `extra` map at the same
//! level and written back unchanged, so a manifest parsed and serialized again is the same JSON
//! value. Typed keys come out in KubeVirt's declaration order (as `kubectl get -o yaml` prints
//! them); unknown keys keep the order they were written in.

mod instancetype;
mod manifest;
mod meta;
mod objects;
mod vm;

pub use instancetype::*;
pub use manifest::*;
pub use meta::*;
pub use objects::*;
pub use vm::*;

/// A JSON object that keeps key order (serde_json's `preserve_order`).
pub type JsonMap = serde_json::Map<String, serde_json::Value>;
