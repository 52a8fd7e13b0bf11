use serde::{Deserialize, Serialize};

use super::JsonMap;

/// `metadata` of every object. Server-managed fields (`uid`, `generation`, `resourceVersion`,
/// `creationTimestamp`) are filled by vmplane when it renders an object; on input they are
/// ignored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The object's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The namespace (absent for cluster-scoped kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Set by vmplane: a new uid each time the name is (re)created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Set by vmplane: the object's generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Set by vmplane: the log position of the object's last event, as a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Labels (string values), in the order written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<JsonMap>,
    /// Annotations (string values), in the order written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<JsonMap>,
    /// Everything else (`creationTimestamp`, `finalizers`, …), kept as written.
    #[serde(flatten)]
    pub extra: JsonMap,
}

impl ObjectMeta {
    /// The name, or "" when absent.
    pub fn name_str(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// A label's value, if it is a string.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref()?.get(key)?.as_str()
    }

    /// An annotation's value, if it is a string.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key)?.as_str()
    }

    /// Removes the fields only the server sets (uid, generation, resourceVersion,
    /// creationTimestamp, managedFields, selfLink, deletionTimestamp).
    pub fn strip_server_fields(&mut self) {
        self.uid = None;
        self.generation = None;
        self.resource_version = None;
        for key in [
            "creationTimestamp",
            "managedFields",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            self.extra.remove(key);
        }
    }
}
