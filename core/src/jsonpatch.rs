//! The JSON patches of a VirtualMachineRestore's and VirtualMachineClone's `spec.patches`:
//! each entry is one RFC 6902 operation written as a JSON object string
//! (`{"op": "replace", "path": "/spec/running", "value": false}`), applied in order to the
//! target VM after vmplane's own changes (KubeVirt applies user patches last).
//!
//! Supported: `add`, `remove`, `replace` and `test`, on JSON-pointer paths with `~0`/`~1`
//! escapes, array indices and `-` (append, `add` only). `move` and `copy` are rejected at
//! validation with a clear cause, as are paths KubeVirt's restore admitter refuses (anything
//! but `/spec/…`, `/metadata/labels/…` and `/metadata/annotations/…`). Pure and total: a patch
//! that does not apply is an error value, never a panic.

use serde_json::Value;

/// One operation kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Insert or set.
    Add,
    /// Delete an existing member.
    Remove,
    /// Set an existing member.
    Replace,
    /// Fail unless the member equals the value.
    Test,
}

/// One parsed patch operation.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchOp {
    /// The operation.
    pub op: Op,
    /// The path as written (`/spec/template/spec/domain/firmware/serial`).
    pub path: String,
    /// The decoded reference tokens of `path`.
    pub tokens: Vec<String>,
    /// The value (`add`, `replace`, `test`).
    pub value: Option<Value>,
}

/// KubeVirt's rule for restore patches: only `/spec/…`, `/metadata/labels/…` and
/// `/metadata/annotations/…`.
pub fn path_allowed(path: &str) -> bool {
    path.starts_with("/spec/")
        || path.starts_with("/metadata/labels/")
        || path.starts_with("/metadata/annotations/")
}

/// Parses one patch string. The error says what is wrong, for a validation cause.
pub fn parse(text: &str) -> Result<PatchOp, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|_| format!("patch is not valid JSON ({text})"))?;
    let Some(obj) = v.as_object() else {
        return Err(format!("patch must be one JSON object ({text})"));
    };
    let op = match obj.get("op").and_then(Value::as_str) {
        Some("add") => Op::Add,
        Some("remove") => Op::Remove,
        Some("replace") => Op::Replace,
        Some("test") => Op::Test,
        Some(other @ ("move" | "copy")) => {
            return Err(format!(
                "patch operation \"{other}\" is not supported by vmplane (use add, remove, replace or test)"
            ));
        }
        Some(other) => return Err(format!("unknown patch operation \"{other}\"")),
        None => return Err(format!("patch has no \"op\" ({text})")),
    };
    let Some(path) = obj.get("path").and_then(Value::as_str) else {
        return Err(format!("patch has no \"path\" ({text})"));
    };
    let tokens = pointer_tokens(path)?;
    let value = obj.get("value").cloned();
    if op != Op::Remove && value.is_none() {
        return Err(format!("patch operation on {path} has no \"value\""));
    }
    Ok(PatchOp {
        op,
        path: path.to_owned(),
        tokens,
        value,
    })
}

fn pointer_tokens(path: &str) -> Result<Vec<String>, String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("patch path {path:?} must start with '/'"));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(format!("patch path {path:?} has a bad '~' escape")),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

/// Applies one operation to `doc` (unchanged on error).
pub fn apply(doc: &mut Value, p: &PatchOp) -> Result<(), String> {
    let missing = || {
        format!(
            "{} operation does not apply: doc is missing path: {}",
            op_name(p.op),
            p.path
        )
    };
    let Some((last, parents)) = p.tokens.split_last() else {
        return Err(format!(
            "{} of the whole document is not supported",
            op_name(p.op)
        ));
    };
    let mut node = &mut *doc;
    for t in parents {
        node = match node {
            Value::Object(m) => m.get_mut(t).ok_or_else(missing)?,
            Value::Array(a) => {
                let i = index(t, a.len()).ok_or_else(missing)?;
                a.get_mut(i).ok_or_else(missing)?
            }
            _ => return Err(missing()),
        };
    }
    let value = || p.value.clone().unwrap_or(Value::Null);
    match (p.op, node) {
        (Op::Add, Value::Object(m)) => {
            m.insert(last.clone(), value());
        }
        (Op::Add, Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                index(last, a.len() + 1).ok_or_else(missing)?
            };
            a.insert(i, value());
        }
        (Op::Replace, Value::Object(m)) => {
            *m.get_mut(last).ok_or_else(missing)? = value();
        }
        (Op::Replace, Value::Array(a)) => {
            let i = index(last, a.len()).ok_or_else(missing)?;
            a[i] = value();
        }
        (Op::Remove, Value::Object(m)) => {
            m.shift_remove(last).ok_or_else(missing)?;
        }
        (Op::Remove, Value::Array(a)) => {
            let i = index(last, a.len()).ok_or_else(missing)?;
            a.remove(i);
        }
        (Op::Test, Value::Object(m)) => {
            if m.get(last) != p.value.as_ref() {
                return Err(format!("test operation failed at {}", p.path));
            }
        }
        (Op::Test, Value::Array(a)) => {
            let i = index(last, a.len()).ok_or_else(missing)?;
            if Some(&a[i]) != p.value.as_ref() {
                return Err(format!("test operation failed at {}", p.path));
            }
        }
        _ => return Err(missing()),
    }
    Ok(())
}

fn index(token: &str, len: usize) -> Option<usize> {
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse::<usize>().ok().filter(|i| *i < len)
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Add => "add",
        Op::Remove => "remove",
        Op::Replace => "replace",
        Op::Test => "test",
    }
}

/// Applies a JSON merge patch (RFC 7386) to `doc`: an object's members merge recursively, a
/// `null` member removes the key, anything else (a scalar, an array, a non-object patch)
/// replaces the value whole. Total: every patch applies.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *doc = patch.clone();
        return;
    };
    if !doc.is_object() {
        *doc = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target) = doc {
        for (key, value) in members {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Applies every patch in order to a copy of `doc`; all or nothing.
pub fn apply_all(doc: &Value, patches: &[PatchOp]) -> Result<Value, String> {
    let mut out = doc.clone();
    for p in patches {
        apply(&mut out, p)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn add_replace_remove_test_and_escapes() {
        let mut doc = json!({"metadata": {"labels": {"a/b": "1"}}, "spec": {"l": [1, 2]}});
        for (text, ok) in [
            (
                r#"{"op":"replace","path":"/metadata/labels/a~1b","value":"2"}"#,
                true,
            ),
            (r#"{"op":"add","path":"/spec/l/-","value":3}"#, true),
            (r#"{"op":"add","path":"/spec/l/0","value":0}"#, true),
            (r#"{"op":"remove","path":"/spec/l/1"}"#, true),
            (r#"{"op":"test","path":"/spec/l","value":[0,2,3]}"#, true),
            (r#"{"op":"replace","path":"/spec/nope","value":1}"#, false),
            (r#"{"op":"remove","path":"/spec/l/9"}"#, false),
        ] {
            let p = parse(text).unwrap();
            assert_eq!(apply(&mut doc, &p).is_ok(), ok, "{text}");
        }
        assert_eq!(doc["metadata"]["labels"]["a/b"], "2");
        assert_eq!(doc["spec"]["l"], json!([0, 2, 3]));
        assert!(
            parse(r#"{"op":"move","from":"/a","path":"/b"}"#)
                .unwrap_err()
                .contains("not supported")
        );
        assert!(parse("[]").is_err());
        assert!(parse("{").is_err());
        assert!(parse(r#"{"op":"add","path":"x","value":1}"#).is_err());
        assert!(path_allowed("/spec/running") && !path_allowed("/metadata/name"));
    }

    #[test]
    fn a_merge_patch_merges_objects_removes_nulls_and_replaces_the_rest() {
        // RFC 7386's own example.
        let mut doc = json!({
            "title": "Goodbye!",
            "author": {"givenName": "John", "familyName": "Doe"},
            "tags": ["example", "sample"],
            "content": "This will be unchanged"
        });
        merge_patch(
            &mut doc,
            &json!({
                "title": "Hello!",
                "phoneNumber": "+01-123-456-7890",
                "author": {"familyName": null},
                "tags": ["example"]
            }),
        );
        assert_eq!(
            doc,
            json!({
                "title": "Hello!",
                "author": {"givenName": "John"},
                "tags": ["example"],
                "content": "This will be unchanged",
                "phoneNumber": "+01-123-456-7890"
            })
        );
        // Into a missing or scalar member: an object is made; a scalar patch replaces.
        let mut doc = json!({"a": 1});
        merge_patch(
            &mut doc,
            &json!({"a": {"b": {"c": null, "d": 2}}, "e": null}),
        );
        assert_eq!(doc, json!({"a": {"b": {"d": 2}}}));
        merge_patch(&mut doc, &json!([1]));
        assert_eq!(doc, json!([1]));
    }
}
