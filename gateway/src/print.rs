//! Output like kubectl's: aligned tables for people, KubeVirt-shaped YAML and JSON for tools.

use std::io::Write;

use anyhow::Context;
use chrono::{DateTime, Utc};

use crate::cli::Output;
use crate::pb;

/// kubectl's short name for a KubeVirt kind.
pub fn short_kind(kind: &str) -> String {
    match kind {
        "VirtualMachine" => "virtualmachine".into(),
        "VirtualMachineInstance" => "virtualmachineinstance".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// The kind as the user typed it, singular.
pub fn short_kind_of_arg(kind: &str) -> String {
    kind.trim_end_matches('s').to_ascii_lowercase()
}

/// Parses an object's JSON document.
fn parse(obj: &pb::Object) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(&obj.json)
        .with_context(|| format!("the server sent invalid JSON for {}/{}", obj.kind, obj.name))
}

/// One object as YAML or JSON, or its `KIND/NAME` line.
pub fn object(
    out: &mut impl Write,
    format: Option<Output>,
    obj: &pb::Object,
) -> anyhow::Result<()> {
    if format == Some(Output::Name) {
        return name(out, obj);
    }
    let value = parse(obj)?;
    value_to(out, format.unwrap_or(Output::Yaml), &value)
}

/// `-o name`: the object as `KIND/NAME`, the form `apply` and `delete` report it in.
pub fn name(out: &mut impl Write, obj: &pb::Object) -> anyhow::Result<()> {
    writeln!(out, "{}/{}", short_kind(&obj.kind), obj.name)?;
    Ok(())
}

/// Any JSON value as YAML or JSON (a table falls back to YAML).
pub fn value(
    out: &mut impl Write,
    format: Output,
    value: &serde_json::Value,
) -> anyhow::Result<()> {
    value_to(out, format, value)
}

fn value_to(
    out: &mut impl Write,
    format: Output,
    value: &impl serde::Serialize,
) -> anyhow::Result<()> {
    match format {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, value)?;
            writeln!(out)?;
        }
        // Names are written by `object` and `list`; a command that prints no object is not
        // given `-o name` (refused when the command line is parsed).
        Output::Yaml | Output::Table | Output::Wide | Output::Name => {
            out.write_all(yaml::to_string(&serde_json::to_value(value)?).as_bytes())?;
        }
    }
    Ok(())
}

/// A list in Kubernetes' shape: `{"apiVersion": "v1", "kind": "List", "items": [...],
/// "metadata": {"resourceVersion": P}}`. Each item is parsed only while it is written, so a
/// long list costs its text, not a tree of every object (~10x the text).
pub fn list(
    out: &mut impl Write,
    format: Option<Output>,
    items: &[pb::Object],
    read_position: u64,
) -> anyhow::Result<()> {
    if format == Some(Output::Name) {
        return items.iter().try_for_each(|obj| name(out, obj));
    }
    if !matches!(format, Some(Output::Json)) {
        // The same document as the JSON's, through the same YAML writer, one item at a time.
        let mut text = String::from("apiVersion: v1\nkind: List\nitems:");
        if items.is_empty() {
            text.push_str(" []");
        }
        text.push('\n');
        out.write_all(text.as_bytes())?;
        for obj in items {
            out.write_all(yaml::list_item(&parse(obj)?).as_bytes())?;
        }
        let metadata = serde_json::json!({"resourceVersion": read_position.to_string()});
        let mut text = String::from("metadata:\n");
        text.push_str(&yaml::indented(&metadata, 2));
        out.write_all(text.as_bytes())?;
        return Ok(());
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct List<'a> {
        api_version: &'static str,
        kind: &'static str,
        items: Items<'a>,
        metadata: Metadata,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        resource_version: String,
    }
    struct Items<'a>(&'a [pb::Object]);
    impl serde::Serialize for Items<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::{Error, SerializeSeq};
            let mut seq = s.serialize_seq(Some(self.0.len()))?;
            for obj in self.0 {
                seq.serialize_element(
                    &parse(obj).map_err(|e| S::Error::custom(format!("{e:#}")))?,
                )?;
            }
            seq.end()
        }
    }
    let list = List {
        api_version: "v1",
        kind: "List",
        items: Items(items),
        metadata: Metadata {
            resource_version: read_position.to_string(),
        },
    };
    value_to(out, format.unwrap_or(Output::Yaml), &list)
}

/// Writes rows as columns separated by three spaces, each as wide as its widest cell.
pub fn table(out: &mut impl Write, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    // A cell is text someone wrote (a label, an annotation, a message): never a terminal's
    // control sequence, nor a line break that would shift the columns.
    let rows: Vec<Vec<std::borrow::Cow<'_, str>>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| printable(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            s.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        // Empty trailing cells leave no padding behind.
        s.truncate(s.trim_end().len());
        s
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in &rows {
        writeln!(out, "{}", line(row.iter().map(AsRef::as_ref).collect()))?;
    }
    Ok(())
}

/// `text` for a terminal: its control characters (ESC, BEL, line breaks, C1 controls) escaped
/// (`\u{1b}`, `\n`), so that text another principal wrote cannot move the cursor, retitle the
/// window or forge lines in a reader's terminal, as kubectl escapes it (CVE-2021-25743).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// kubectl's age: `42s`, `5m`, `3h`, `12d`.
pub fn age(created: Option<&str>, now: DateTime<Utc>) -> String {
    let Some(created) = created.and_then(|c| DateTime::parse_from_rfc3339(c).ok()) else {
        return "<unknown>".into();
    };
    let secs = (now - created.with_timezone(&Utc)).num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 2 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The value at `path`, if there is one.
fn value_at<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |cur, p| cur.get(p))
}

/// A cell of the value at `path`: a string as it is, a boolean or number as JSON writes it,
/// empty when absent (kubectl's printer columns).
fn text_at(v: &serde_json::Value, path: &[&str]) -> String {
    match value_at(v, path) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(cell @ (serde_json::Value::Bool(_) | serde_json::Value::Number(_))) => {
            cell.to_string()
        }
        _ => String::new(),
    }
}

/// A date column as kubectl prints one: its age, empty when absent.
fn when(at: Option<&str>, now: DateTime<Utc>) -> String {
    at.map(|at| age(Some(at), now)).unwrap_or_default()
}

fn str_at<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a str> {
    value_at(v, path)?.as_str()
}

/// Why a snapshot, restore or clone failed, from its `status` (`None` while it has not):
/// KubeVirt's `Failure` condition (snapshots, restores), else, once the phase is `Failed`,
/// `status.error.message` (snapshots) or the first condition's `message` (a clone's `Ready`).
pub fn saga_failure(status: &serde_json::Value) -> Option<String> {
    let conditions = status
        .get("conditions")
        .and_then(|c| c.as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let text = |c: &serde_json::Value, key: &str| {
        c.get(key)
            .and_then(|m| m.as_str())
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
    };
    let condition = conditions.iter().find(|c| {
        c.get("type").and_then(|t| t.as_str()) == Some("Failure")
            && c.get("status").and_then(|s| s.as_str()) == Some("True")
    });
    let failed = status.get("phase").and_then(|p| p.as_str()) == Some("Failed");
    if condition.is_none() && !failed {
        return None;
    }
    let error = status.get("error").and_then(|e| text(e, "message"));
    let reason = condition.and_then(|c| text(c, "message").or_else(|| text(c, "reason")));
    let message = conditions.iter().find_map(|c| text(c, "message"));
    Some(
        error
            .or(reason)
            .or(message)
            .unwrap_or_else(|| "failed".to_owned()),
    )
}

/// A table of objects, with columns that fit their kind; `wide` (`-o wide`) adds a VM's
/// readiness, run strategy, instancetype, preference and firmware UUID origin, a VMI's origin,
/// and every object's resourceVersion.
/// What `get`'s table shows beyond its kind's columns.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// A NAMESPACE column first (`-A`).
    pub with_ns: bool,
    /// `-o wide`'s columns.
    pub wide: bool,
    /// A column per label key (`-L KEY`), headed as kubectl heads it: the key's last
    /// `/`-separated part, upper-cased.
    pub label_columns: Vec<String>,
    /// A LABELS column last (`--show-labels`): `key=value` pairs by key, `<none>` without any.
    pub show_labels: bool,
}

pub fn object_table(
    out: &mut impl Write,
    items: &[pb::Object],
    options: &TableOptions,
) -> anyhow::Result<()> {
    let TableOptions {
        with_ns,
        wide,
        ref label_columns,
        show_labels,
    } = *options;
    let now = Utc::now();
    let kind = items.first().map(|o| o.kind.as_str()).unwrap_or("");
    let mut header: Vec<&str> = Vec::new();
    if with_ns {
        header.push("NAMESPACE");
    }
    let mut rows = Vec::new();
    // Snapshots, restores and clones: KubeVirt's printer columns (a date column as an age).
    match kind {
        "VirtualMachine" => header.extend(["NAME", "STATUS", "AGE", "GENERATION", "FIRMWARE-UUID"]),
        "VirtualMachineInstance" => {
            header.extend(["NAME", "PHASE", "AGE", "NODE", "FIRMWARE-UUID"])
        }
        "VirtualMachineSnapshot" => header.extend([
            "NAME",
            "SOURCEKIND",
            "SOURCENAME",
            "PHASE",
            "READYTOUSE",
            "CREATIONTIME",
            "ERROR",
        ]),
        "VirtualMachineRestore" => header.extend([
            "NAME",
            "TARGETKIND",
            "TARGETNAME",
            "COMPLETE",
            "RESTORETIME",
            "ERROR",
        ]),
        "VirtualMachineClone" => header.extend([
            "NAME",
            "PHASE",
            "SOURCEVIRTUALMACHINE",
            "TARGETVIRTUALMACHINE",
        ]),
        _ => header.extend(["NAME", "AGE", "GENERATION"]),
    }
    if wide {
        match kind {
            "VirtualMachine" => header.extend([
                "READY",
                "RUN-STRATEGY",
                "INSTANCETYPE",
                "PREFERENCE",
                "UUID-ORIGIN",
            ]),
            "VirtualMachineInstance" => header.push("UUID-ORIGIN"),
            _ => {}
        }
        header.push("RESOURCE-VERSION");
    }
    let label_headers: Vec<String> = label_columns
        .iter()
        .map(|key| key.rsplit('/').next().unwrap_or(key).to_uppercase())
        .collect();
    header.extend(label_headers.iter().map(String::as_str));
    if show_labels {
        header.push("LABELS");
    }
    for obj in items {
        let v = parse(obj)?;
        let created = str_at(&v, &["metadata", "creationTimestamp"]);
        let mut row = Vec::new();
        if with_ns {
            row.push(obj.namespace.clone());
        }
        row.push(obj.name.clone());
        match kind {
            "VirtualMachine" => {
                row.push(
                    str_at(&v, &["status", "printableStatus"])
                        .unwrap_or("")
                        .to_string(),
                );
                row.push(age(created, now));
                row.push(obj.generation.to_string());
                row.push(
                    str_at(
                        &v,
                        &["spec", "template", "spec", "domain", "firmware", "uuid"],
                    )
                    .unwrap_or("")
                    .to_string(),
                );
            }
            "VirtualMachineInstance" => {
                row.push(str_at(&v, &["status", "phase"]).unwrap_or("").to_string());
                row.push(age(created, now));
                row.push(
                    str_at(&v, &["status", "nodeName"])
                        .unwrap_or("")
                        .to_string(),
                );
                row.push(
                    str_at(&v, &["spec", "domain", "firmware", "uuid"])
                        .unwrap_or("")
                        .to_string(),
                );
            }
            "VirtualMachineSnapshot" => {
                row.extend([
                    text_at(&v, &["spec", "source", "kind"]),
                    text_at(&v, &["spec", "source", "name"]),
                    text_at(&v, &["status", "phase"]),
                    text_at(&v, &["status", "readyToUse"]),
                    when(str_at(&v, &["status", "creationTime"]), now),
                    v.get("status").and_then(saga_failure).unwrap_or_default(),
                ]);
            }
            "VirtualMachineRestore" => {
                row.extend([
                    text_at(&v, &["spec", "target", "kind"]),
                    text_at(&v, &["spec", "target", "name"]),
                    text_at(&v, &["status", "complete"]),
                    when(str_at(&v, &["status", "restoreTime"]), now),
                    v.get("status").and_then(saga_failure).unwrap_or_default(),
                ]);
            }
            "VirtualMachineClone" => row.extend([
                text_at(&v, &["status", "phase"]),
                text_at(&v, &["spec", "source", "name"]),
                text_at(&v, &["spec", "target", "name"]),
            ]),
            _ => {
                row.push(age(created, now));
                row.push(obj.generation.to_string());
            }
        }
        if wide {
            match kind {
                "VirtualMachine" => row.extend([
                    text_at(&v, &["status", "ready"]),
                    text_at(&v, &["status", "runStrategy"]),
                    text_at(&v, &["spec", "instancetype", "name"]),
                    text_at(&v, &["spec", "preference", "name"]),
                    text_at(&v, &["status", "firmwareUUIDOrigin"]),
                ]),
                "VirtualMachineInstance" => {
                    row.push(text_at(&v, &["status", "firmwareUUIDOrigin"]));
                }
                _ => {}
            }
            row.push(obj.resource_version.to_string());
        }
        let labels = v
            .pointer("/metadata/labels")
            .and_then(serde_json::Value::as_object);
        let label = |key: &str| {
            labels
                .and_then(|m| m.get(key))
                .and_then(serde_json::Value::as_str)
        };
        row.extend(
            label_columns
                .iter()
                .map(|key| label(key).unwrap_or_default().to_owned()),
        );
        if show_labels {
            // By key, as kubectl prints them (the map keeps the object's own order).
            let mut pairs: Vec<String> = labels
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            pairs.sort();
            row.push(if pairs.is_empty() {
                "<none>".to_owned()
            } else {
                pairs.join(",")
            });
        }
        rows.push(row);
    }
    table(out, &header, &rows)?;
    Ok(())
}

/// The width of `describe`'s labels (`Resource Version:` and a space), its values' column.
const LABEL_WIDTH: usize = 19;

/// `describe`: an object for people, as kubectl describes one. Who and what it is, its labels
/// and annotations, its spec and status (indented YAML), then its latest `events` revisions
/// from the log (all with 0), oldest first, each with its age.
pub fn describe(
    out: &mut impl Write,
    obj: &pb::Object,
    revisions: &[pb::Revision],
    events: usize,
) -> anyhow::Result<()> {
    let v = parse(obj)?;
    let now = Utc::now();
    let pairs = |key: &str| -> String {
        let map = v
            .pointer(&format!("/metadata/{key}"))
            .and_then(serde_json::Value::as_object)
            .filter(|m| !m.is_empty());
        match map {
            None => "<none>".to_owned(),
            Some(map) => map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        printable(k),
                        printable(v.as_str().unwrap_or_default())
                    )
                })
                .collect::<Vec<_>>()
                .join(&format!("\n{:LABEL_WIDTH$}", "")),
        }
    };
    let created = str_at(&v, &["metadata", "creationTimestamp"]);
    let mut fields = vec![
        ("Name:", obj.name.clone()),
        (
            "Namespace:",
            if obj.namespace.is_empty() {
                "<cluster>".to_owned()
            } else {
                obj.namespace.clone()
            },
        ),
        ("Kind:", obj.kind.clone()),
        ("UID:", obj.uid.clone()),
        ("Generation:", obj.generation.to_string()),
        ("Resource Version:", obj.resource_version.to_string()),
    ];
    if let Some(at) = created {
        fields.push(("Created:", format!("{at} ({} ago)", age(Some(at), now))));
    }
    // Being deleted (a VM Terminating while its VMI stops).
    if let Some(at) = str_at(&v, &["metadata", "deletionTimestamp"]) {
        fields.push((
            "Deletion:",
            format!("requested {at} ({} ago)", age(Some(at), now)),
        ));
    }
    fields.push(("Labels:", pairs("labels")));
    fields.push(("Annotations:", pairs("annotations")));
    for (label, value) in fields {
        writeln!(out, "{label:<LABEL_WIDTH$}{value}")?;
    }
    for (label, key) in [("Spec:", "spec"), ("Status:", "status")] {
        let Some(section) = v.get(key).filter(|s| !s.is_null()) else {
            continue;
        };
        writeln!(out, "{label}")?;
        out.write_all(yaml::indented(section, 2).as_bytes())?;
    }
    let shown = if events == 0 {
        revisions
    } else {
        &revisions[revisions.len().saturating_sub(events)..]
    };
    if shown.is_empty() {
        writeln!(out, "{:<LABEL_WIDTH$}<none>", "Events:")?;
        return Ok(());
    }
    let earlier = revisions.len() - shown.len();
    if earlier > 0 {
        writeln!(
            out,
            "{:<LABEL_WIDTH$}the latest {} of {} (all: vmplane history {} {}{})",
            "Events:",
            shown.len(),
            revisions.len(),
            short_kind(&obj.kind),
            obj.name,
            if obj.namespace.is_empty() {
                String::new()
            } else {
                format!(" -n {}", obj.namespace)
            }
        )?;
    } else {
        writeln!(out, "Events:")?;
    }
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|r| {
            vec![
                revisions_of(r),
                age(Some(&r.time), now),
                r.actor.clone(),
                r.events.join(","),
                r.summary.clone(),
            ]
        })
        .collect();
    let mut text = Vec::new();
    table(
        &mut text,
        &["REVISION", "AGE", "ACTOR", "EVENTS", "SUMMARY"],
        &rows,
    )?;
    for line in String::from_utf8_lossy(&text).lines() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// `history`: a table (`-o wide` adds each row's `metadata.generation`), or a list of
/// `{revision, position, generation, time, actor, events, summary}`.
pub fn history(
    out: &mut impl Write,
    format: Option<Output>,
    revisions: &[pb::Revision],
) -> anyhow::Result<()> {
    match format {
        None | Some(Output::Table | Output::Wide) => {
            let wide = format == Some(Output::Wide);
            let rows: Vec<Vec<String>> = revisions
                .iter()
                .map(|r| {
                    let mut row = vec![revisions_of(r)];
                    if wide {
                        row.push(r.generation.to_string());
                    }
                    row.extend([
                        r.position.to_string(),
                        r.time.clone(),
                        r.actor.clone(),
                        r.events.join(","),
                        r.summary.clone(),
                    ]);
                    row
                })
                .collect();
            let headers: &[&str] = if wide {
                &[
                    "REVISION",
                    "GENERATION",
                    "POSITION",
                    "TIME",
                    "ACTOR",
                    "EVENTS",
                    "SUMMARY",
                ]
            } else {
                &["REVISION", "POSITION", "TIME", "ACTOR", "EVENTS", "SUMMARY"]
            };
            table(out, headers, &rows)?;
        }
        Some(f) => {
            let list: Vec<serde_json::Value> = revisions
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "revision": r.revision, "firstRevision": first_revision(r),
                        "position": r.position,
                        "generation": r.generation, "time": r.time, "actor": r.actor,
                        "events": r.events, "summary": r.summary,
                    })
                })
                .collect();
            value_to(out, f, &serde_json::Value::Array(list))?;
        }
    }
    Ok(())
}

/// The revisions a history row covers: `5`, or `3-5` for a row of the events one request
/// appended at revisions 3 to 5 (each of which `get --revision` takes).
fn revisions_of(r: &pb::Revision) -> String {
    match first_revision(r) {
        first if first < r.revision => format!("{first}-{}", r.revision),
        _ => r.revision.to_string(),
    }
}

/// A history row's first revision (a server that does not say it has rows of one revision).
fn first_revision(r: &pb::Revision) -> u64 {
    if r.first_revision == 0 {
        r.revision
    } else {
        r.first_revision
    }
}

/// `audit`: a table, or a list of `{position, time, actor, namespace, kind, name, event, summary}`.
pub fn audit(
    out: &mut impl Write,
    format: Option<Output>,
    entries: &[pb::AuditEntry],
) -> anyhow::Result<()> {
    match format {
        None | Some(Output::Table | Output::Wide) => {
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        e.position.to_string(),
                        e.time.clone(),
                        e.actor.clone(),
                        e.namespace.clone(),
                        e.kind.clone(),
                        e.name.clone(),
                        e.event.clone(),
                        e.summary.clone(),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "POSITION",
                    "TIME",
                    "ACTOR",
                    "NAMESPACE",
                    "KIND",
                    "NAME",
                    "EVENT",
                    "SUMMARY",
                ],
                &rows,
            )?;
        }
        Some(f) => {
            let list: Vec<serde_json::Value> = entries.iter().map(audit_json).collect();
            value_to(out, f, &serde_json::Value::Array(list))?;
        }
    }
    Ok(())
}

fn audit_json(e: &pb::AuditEntry) -> serde_json::Value {
    serde_json::json!({
        "position": e.position, "time": e.time, "actor": e.actor, "namespace": e.namespace,
        "kind": e.kind, "name": e.name, "event": e.event, "summary": e.summary,
    })
}

/// One watch event: with JSON one object a line
/// (`{position, time, actor, namespace, kind, name, event}`), otherwise a table row.
pub fn watch_event(
    out: &mut impl Write,
    format: Option<Output>,
    e: &pb::WatchEvent,
    table: &mut WatchTable,
) -> anyhow::Result<()> {
    match format {
        Some(Output::Json) => {
            let v = serde_json::json!({
                "position": e.position, "time": e.time, "actor": e.actor,
                "namespace": e.namespace, "kind": e.kind, "name": e.name, "event": e.event,
            });
            serde_json::to_writer(&mut *out, &v)?;
            writeln!(out)?;
        }
        Some(Output::Yaml) => {
            writeln!(out, "---")?;
            let v = serde_json::json!({
                "position": e.position, "time": e.time, "actor": e.actor,
                "namespace": e.namespace, "kind": e.kind, "name": e.name, "event": e.event,
            });
            out.write_all(yaml::to_string(&v).as_bytes())?;
        }
        // `-o name` is refused for `watch` when the command line is parsed.
        None | Some(Output::Table | Output::Wide | Output::Name) => table.row(out, e)?,
    }
    Ok(())
}

/// The columns of `watch`'s table. A stream cannot be aligned after the fact, so the columns
/// start wide enough for what they usually hold (a timestamp with nanoseconds, the longest
/// kind, system actors) and a value wider than its column widens it for every later row.
#[derive(Debug)]
pub struct WatchTable {
    header_done: bool,
    /// POSITION, TIME, ACTOR, NAMESPACE, KIND, NAME (EVENT is last and unpadded).
    widths: [usize; 6],
}

impl Default for WatchTable {
    fn default() -> Self {
        WatchTable {
            header_done: false,
            widths: [10, 30, 20, 16, 31, 24],
        }
    }
}

impl WatchTable {
    fn row(&mut self, out: &mut impl Write, e: &pb::WatchEvent) -> std::io::Result<()> {
        let position = e.position.to_string();
        let cells = [
            position.as_str(),
            e.time.as_str(),
            e.actor.as_str(),
            e.namespace.as_str(),
            e.kind.as_str(),
            e.name.as_str(),
        ];
        if !self.header_done {
            self.header_done = true;
            let names = ["POSITION", "TIME", "ACTOR", "NAMESPACE", "KIND", "NAME"];
            self.line(out, &names, "EVENT")?;
        }
        for (width, cell) in self.widths.iter_mut().zip(cells) {
            *width = (*width).max(cell.chars().count());
        }
        self.line(out, &cells, &e.event)
    }

    fn line(&self, out: &mut impl Write, cells: &[&str; 6], last: &str) -> std::io::Result<()> {
        for (cell, width) in cells.iter().zip(self.widths) {
            write!(out, "{cell:<width$}   ")?;
        }
        writeln!(out, "{last}")
    }
}

/// `features`: a table, or a list of `{name, enabled, source, stage, usedBy}`.
pub fn features(
    out: &mut impl Write,
    format: Option<Output>,
    features: &[pb::Feature],
) -> anyhow::Result<()> {
    match format {
        None | Some(Output::Table | Output::Wide) => {
            let rows: Vec<Vec<String>> = features
                .iter()
                .map(|f| {
                    vec![
                        f.name.clone(),
                        f.enabled.to_string(),
                        f.source.clone(),
                        f.stage.clone(),
                        f.used_by.to_string(),
                    ]
                })
                .collect();
            table(
                out,
                &["NAME", "ENABLED", "SOURCE", "STAGE", "USED-BY"],
                &rows,
            )?;
        }
        Some(f) => {
            let list: Vec<serde_json::Value> = features
                .iter()
                .map(|x| {
                    serde_json::json!({
                        "name": x.name, "enabled": x.enabled, "source": x.source,
                        "stage": x.stage, "usedBy": x.used_by,
                    })
                })
                .collect();
            value_to(out, f, &serde_json::Value::Array(list))?;
        }
    }
    Ok(())
}

/// `features usage FEATURE`: the VMs that request it.
pub fn feature_usage(
    out: &mut impl Write,
    format: Option<Output>,
    feature: &str,
    resp: &pb::FeatureUsageResponse,
) -> anyhow::Result<()> {
    match format {
        None | Some(Output::Table | Output::Wide) => {
            if resp.users.is_empty() {
                writeln!(out, "No VM requests {feature}.")?;
                return Ok(());
            }
            let rows: Vec<Vec<String>> = resp
                .users
                .iter()
                .map(|u| vec![u.namespace.clone(), u.name.clone(), u.kind.clone()])
                .collect();
            table(out, &["NAMESPACE", "NAME", "KIND"], &rows)?;
        }
        Some(f) => {
            let v = serde_json::json!({
                "feature": feature,
                "enabled": resp.enabled,
                "usedBy": resp.users.iter().map(|u| serde_json::json!({
                    "kind": u.kind, "namespace": u.namespace, "name": u.name,
                })).collect::<Vec<_>>(),
                "resourceVersion": resp.read_position.to_string(),
            });
            value_to(out, f, &v)?;
        }
    }
    Ok(())
}

/// A unified diff, colored on a terminal.
pub fn unified_diff(out: &mut impl Write, diff: &str, color: bool) -> std::io::Result<()> {
    for line in diff.lines() {
        if !color {
            writeln!(out, "{line}")?;
        } else if line.starts_with("+++") || line.starts_with("---") {
            writeln!(out, "\x1b[1m{line}\x1b[0m")?;
        } else if line.starts_with('+') {
            writeln!(out, "\x1b[32m{line}\x1b[0m")?;
        } else if line.starts_with('-') {
            writeln!(out, "\x1b[31m{line}\x1b[0m")?;
        } else if line.starts_with("@@") {
            writeln!(out, "\x1b[36m{line}\x1b[0m")?;
        } else {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// YAML as `kubectl get -o yaml` writes it, for every reader: block style, two-space indents,
/// sequences not indented under their key, and every string that a YAML 1.1 reader (kubectl's
/// go-yaml, PyYAML) would take for something else quoted.
///
/// serde_yaml writes YAML 1.2, where only `true`/`false`/`null`/`~` and 1.2's numbers are not
/// strings: it leaves `yes`, `on`, `off`, `y`, `n`, `0o17`-less octals such as `0777` aside,
/// sexagesimals (`1:20`), `1_000` and timestamps plain, and a 1.1 reader then reads a label
/// `on` as the boolean `true` (`vmplane get -o yaml | kubectl apply -f -` fails). This writer
/// lays out the structure itself and takes each scalar's text from serde_yaml (so the output is
/// serde_yaml's byte for byte, tests hold it), but single-quotes those strings, keys included.
pub mod yaml {
    use serde_json::Value;

    /// `value` as a YAML document (no `---`), ending in a newline.
    pub fn to_string(value: &Value) -> String {
        let mut out = String::new();
        Writer { quote_yaml11: true }.document(&mut out, value, 0);
        out
    }

    /// `value` as a YAML document with every line indented by `indent` spaces (a section of a
    /// larger text).
    pub fn indented(value: &Value, indent: usize) -> String {
        let mut out = String::new();
        Writer { quote_yaml11: true }.document(&mut out, value, indent);
        out
    }

    /// `value` as one item (`- ...`) of a top-level sequence.
    pub fn list_item(value: &Value) -> String {
        let mut out = String::new();
        Writer { quote_yaml11: true }.seq_item(&mut out, value, 0, false);
        out
    }

    /// Whether a YAML 1.1 reader (or a 1.2 one) would read the plain scalar `s` as something
    /// other than a string: a boolean (`y|yes|on|off|n|no|true|false` in their three cases), a
    /// null (`~`, `null`, empty), a merge or value key (`<<`, `=`), a number (signed or not:
    /// decimal with `_`, octal `0777`, `0o17`, hex `0x1F`, binary `0b101`, float `.5`, `1.`,
    /// `1e3`, sexagesimal `1:20`, `1:20.5`, `.inf`, `.nan`), or a timestamp (`2024-01-01...`).
    /// Quoting more than a reader needs is harmless: a quoted scalar is always a string.
    pub fn reads_as_non_string(s: &str) -> bool {
        matches!(
            s,
            "" | "~"
                | "null"
                | "Null"
                | "NULL"
                | "<<"
                | "="
                | "y"
                | "Y"
                | "yes"
                | "Yes"
                | "YES"
                | "n"
                | "N"
                | "no"
                | "No"
                | "NO"
                | "true"
                | "True"
                | "TRUE"
                | "false"
                | "False"
                | "FALSE"
                | "on"
                | "On"
                | "ON"
                | "off"
                | "Off"
                | "OFF"
        ) || number(s)
            || timestamp(s)
    }

    fn digits_(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    }

    fn number(s: &str) -> bool {
        let body = s.strip_prefix(['+', '-']).unwrap_or(s);
        let lower = body.to_ascii_lowercase();
        if matches!(lower.as_str(), ".inf" | ".nan" | "inf" | "infinity" | "nan") {
            return true;
        }
        for (prefix, ok) in [
            ("0x", (|b: u8| b.is_ascii_hexdigit()) as fn(u8) -> bool),
            ("0o", |b| (b'0'..=b'7').contains(&b)),
            ("0b", |b| b == b'0' || b == b'1'),
        ] {
            if let Some(rest) = lower.strip_prefix(prefix) {
                return !rest.is_empty() && rest.bytes().all(|b| ok(b) || b == b'_');
            }
        }
        if !body.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return false;
        }
        if body.contains(':') {
            // Sexagesimal: 1:20, 190:20:30, 1:20.5.
            let mut parts = body.split(':');
            let first = parts.next().unwrap_or_default();
            let mut rest: Vec<&str> = parts.collect();
            let last = rest.pop().unwrap_or_default();
            let (last_int, fraction) = last.split_once('.').unwrap_or((last, ""));
            return digits_(first)
                && rest.iter().all(|p| digits_(p))
                && digits_(last_int)
                && fraction.bytes().all(|b| b.is_ascii_digit() || b == b'_');
        }
        // Decimal integer or float: digits and `_`, at most one `.`, an optional exponent.
        let (mantissa, exponent) = match lower.find('e') {
            Some(i) => (&body[..i], Some(&body[i + 1..])),
            None => (body, None),
        };
        let (int, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let int_ok = int.is_empty() || digits_(int);
        let fraction_ok = fraction.bytes().all(|b| b.is_ascii_digit() || b == b'_');
        let has_digit = mantissa.bytes().any(|b| b.is_ascii_digit());
        let exponent_ok = exponent.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
        });
        int_ok && fraction_ok && has_digit && exponent_ok
    }

    /// `YYYY-M-D`, with or without a time after it: YAML 1.1's timestamp.
    fn timestamp(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() >= 8
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5].is_ascii_digit()
            && s[5..].contains('-')
    }

    /// A string scalar's text as serde_yaml writes it, for the plain cases without asking it.
    fn plain_without_asking(s: &str) -> bool {
        s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'))
            && !matches!(
                s,
                "true" | "True" | "TRUE" | "false" | "False" | "FALSE" | "null" | "Null" | "NULL"
            )
    }

    struct Writer {
        /// Whether strings YAML 1.1 reads as something else are quoted (off only in the test
        /// that holds the layout equal to serde_yaml's).
        quote_yaml11: bool,
    }

    impl Writer {
        /// A scalar's text on one line, or a block scalar's header and lines (each line after
        /// the first indented by two spaces, to be indented further by the caller).
        fn scalar(&self, v: &Value) -> String {
            match v {
                Value::String(s) if self.quote_yaml11 && reads_as_non_string(s) => {
                    format!("'{}'", s.replace('\'', "''"))
                }
                Value::String(s) if plain_without_asking(s) => s.clone(),
                Value::Null => "null".into(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) if !n.is_f64() => n.to_string(),
                other => {
                    let mut text = serde_yaml::to_string(other)
                        .unwrap_or_else(|_| serde_json::to_string(other).unwrap_or_default());
                    if text.ends_with('\n') {
                        text.pop();
                    }
                    text
                }
            }
        }

        /// A mapping key: its scalar text, or a double-quoted one when serde_yaml would need a
        /// complex (`? `) key (a key over lines).
        fn key(&self, k: &str) -> String {
            let text = self.scalar(&Value::String(k.to_string()));
            if text.contains('\n') {
                serde_json::to_string(k).unwrap_or_default()
            } else {
                text
            }
        }

        /// Writes a scalar after `: ` or `- ` (already written), a block scalar's lines at
        /// `indent + 2`.
        fn scalar_rest(&self, out: &mut String, v: &Value, indent: usize) {
            let text = self.scalar(v);
            let mut lines = text.split('\n');
            out.push_str(lines.next().unwrap_or_default());
            out.push('\n');
            for line in lines {
                if !line.is_empty() {
                    push_indent(out, indent);
                    out.push_str(line);
                }
                out.push('\n');
            }
        }

        fn document(&self, out: &mut String, v: &Value, indent: usize) {
            match v {
                Value::Object(m) if !m.is_empty() => self.map_entries(out, m, indent, false),
                Value::Array(a) if !a.is_empty() => {
                    for item in a {
                        self.seq_item(out, item, indent, false);
                    }
                }
                other => {
                    push_indent(out, indent);
                    self.value_rest(out, other, indent);
                }
            }
        }

        /// Writes a value whose line has begun (after `key: ` or `- `): a scalar or an empty
        /// collection on that line.
        fn value_rest(&self, out: &mut String, v: &Value, indent: usize) {
            match v {
                Value::Object(m) if m.is_empty() => out.push_str("{}\n"),
                Value::Array(a) if a.is_empty() => out.push_str("[]\n"),
                other => self.scalar_rest(out, other, indent),
            }
        }

        fn map_entries(
            &self,
            out: &mut String,
            m: &serde_json::Map<String, Value>,
            indent: usize,
            inline_first: bool,
        ) {
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 || !inline_first {
                    push_indent(out, indent);
                }
                out.push_str(&self.key(k));
                out.push(':');
                match v {
                    Value::Object(child) if !child.is_empty() => {
                        out.push('\n');
                        self.map_entries(out, child, indent + 2, false);
                    }
                    // A sequence under a key is not indented (as kubectl and serde_yaml write).
                    Value::Array(items) if !items.is_empty() => {
                        out.push('\n');
                        for item in items {
                            self.seq_item(out, item, indent, false);
                        }
                    }
                    other => {
                        out.push(' ');
                        self.value_rest(out, other, indent);
                    }
                }
            }
        }

        fn seq_item(&self, out: &mut String, v: &Value, indent: usize, inline: bool) {
            if !inline {
                push_indent(out, indent);
            }
            out.push_str("- ");
            match v {
                Value::Object(m) if !m.is_empty() => self.map_entries(out, m, indent + 2, true),
                Value::Array(items) if !items.is_empty() => {
                    for (i, item) in items.iter().enumerate() {
                        self.seq_item(out, item, indent + 2, i == 0);
                    }
                }
                other => self.value_rest(out, other, indent),
            }
        }
    }

    fn push_indent(out: &mut String, indent: usize) {
        out.extend(std::iter::repeat_n(' ', indent));
    }

    #[cfg(test)]
    pub(super) fn to_string_yaml12(value: &Value) -> String {
        let mut out = String::new();
        Writer {
            quote_yaml11: false,
        }
        .document(&mut out, value, 0);
        out
    }
}

#[cfg(test)]
mod tests {

    fn watch_event(
        position: u64,
        time: &str,
        actor: &str,
        kind: &str,
        name: &str,
    ) -> pb::WatchEvent {
        pb::WatchEvent {
            position,
            time: time.into(),
            actor: actor.into(),
            namespace: "default".into(),
            kind: kind.into(),
            name: name.into(),
            event: "RestoreStarted".into(),
        }
    }

    #[test]
    fn text_someone_wrote_reaches_a_terminal_with_its_control_characters_escaped() {
        let evil = "hi\u{1b}[31mRED\u{1b}]0;pwned\u{7}x\nforged\u{9b}2J";
        let obj = pb::Object {
            kind: "VirtualMachine".into(),
            namespace: "team-a".into(),
            name: "a2".into(),
            json: json!({"metadata": {"annotations": {"note": evil}, "labels": {evil: "v"}},
                "spec": {"note": evil}})
            .to_string(),
            ..Default::default()
        };
        let mut out = Vec::new();
        describe(&mut out, &obj, &[], 20).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            !text.contains(['\u{1b}', '\u{7}', '\u{9b}']),
            "a control character reached the terminal: {text:?}"
        );
        let shown = "hi\\u{1b}[31mRED\\u{1b}]0;pwned\\u{7}x\\nforged\\u{9b}2J";
        assert!(text.contains(&format!("note={shown}")), "{text}");
        assert!(text.contains(&format!("{shown}=v")), "{text}");
        let mut out = Vec::new();
        table(
            &mut out,
            &["A", "B"],
            &[vec![evil.to_owned(), "b".to_owned()]],
        )
        .expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains(&format!("{shown}   b")), "{text:?}");
        assert_eq!(printable("plain – text"), "plain – text");
    }

    #[test]
    fn the_watch_table_lines_up_with_its_header_and_widens_for_a_long_value() {
        let mut table = WatchTable::default();
        let mut out = Vec::new();
        let t = "2026-11-22T21:16:40.128945706Z";
        for e in [
            watch_event(169, t, "system:saga-driver", "VirtualMachineRestore", "r1"),
            watch_event(170, t, "alice", "VirtualMachine", "demo"),
        ] {
            watch_event_row(&mut out, &e, &mut table);
        }
        let text = String::from_utf8(out).expect("UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        // Each column starts where its header does, on every line.
        let starts = |line: &str| -> Vec<usize> {
            let mut starts = vec![0];
            let bytes = line.as_bytes();
            for i in 1..bytes.len() {
                if bytes[i] != b' ' && bytes[i - 1] == b' ' && bytes[i.saturating_sub(2)] == b' ' {
                    starts.push(i);
                }
            }
            starts
        };
        assert_eq!(starts(lines[0]).len(), 7, "{text}");
        assert_eq!(starts(lines[1]), starts(lines[0]), "{text}");
        assert_eq!(starts(lines[2]), starts(lines[0]), "{text}");
        // A name wider than its column widens it from then on; later rows agree.
        let long = "a-very-long-name-that-does-not-fit-the-column";
        let mut out = Vec::new();
        for name in [long, "short"] {
            watch_event_row(
                &mut out,
                &watch_event(171, t, "ops", "VirtualMachine", name),
                &mut table,
            );
        }
        let text = String::from_utf8(out).expect("UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(starts(lines[0]), starts(lines[1]), "{text}");
    }

    fn watch_event_row(out: &mut Vec<u8>, e: &pb::WatchEvent, table: &mut WatchTable) {
        super::watch_event(out, None, e, table).expect("print");
    }

    use serde_json::json;

    use super::*;

    /// Every YAML document of the shared KubeVirt test data, as JSON values (looked for as
    /// `tests/testdata_dir.rs` says; that file cannot be included from a unit test's module).
    fn kubevirt_documents() -> Vec<serde_json::Value> {
        mod testdata_dir {
            pub fn kubevirt_testdata() -> std::path::PathBuf {
                let beside =
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/testdata");
                let base = match std::env::var_os("VMPLANE_TESTDATA") {
                    Some(dir) => dir.into(),
                    None if beside.exists() => beside,
                    None => "/work/shared/testdata".into(),
                };
                base.join("kubevirt")
            }
        }
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("test data").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|x| x == "yaml") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        walk(&testdata_dir::kubevirt_testdata(), &mut files);
        files.sort();
        assert!(files.len() >= 40, "the shared test data is there");
        files
            .iter()
            .flat_map(|f| {
                vmplane_core::types::parse_documents(&std::fs::read(f).expect("read"))
                    .expect("parse")
            })
            .collect()
    }

    /// Strings YAML 1.1 readers (kubectl's go-yaml, PyYAML) take for booleans, nulls,
    /// numbers or timestamps, which serde_yaml (YAML 1.2) writes plain.
    const YAML11_WORDS: &[&str] = &[
        "y",
        "Y",
        "yes",
        "Yes",
        "YES",
        "n",
        "N",
        "no",
        "No",
        "NO",
        "true",
        "True",
        "TRUE",
        "false",
        "False",
        "FALSE",
        "on",
        "On",
        "ON",
        "off",
        "Off",
        "OFF",
        "~",
        "null",
        "Null",
        "NULL",
        "",
        "0777",
        "1e3",
        ".5",
        "1:20",
        "190:20:30",
        "-1:20",
        "1:20.5",
        "1_000",
        "+1",
        "-1",
        "1.",
        "0x1F",
        "0o17",
        "0b101",
        ".inf",
        "-.Inf",
        ".NaN",
        "+.5",
        "12e-3",
        "<<",
        "2024-01-01",
        "2026-11-22T11:59:18Z",
    ];

    #[test]
    fn yaml_quotes_every_string_a_yaml11_reader_would_take_for_another_type() {
        for word in YAML11_WORDS {
            let doc = json!({"metadata": {"labels": {*word: *word}}, "list": [*word]});
            assert_eq!(
                yaml::to_string(&doc),
                format!("metadata:\n  labels:\n    '{word}': '{word}'\nlist:\n- '{word}'\n"),
                "{word:?}"
            );
        }
        // Strings every reader takes as strings stay plain, as kubectl writes them.
        for word in [
            "web",
            "yess",
            "onion",
            "Halted",
            "kubevirt.io/v1",
            "2Gi",
            "100m",
            "v1.2.3",
            "1.2.3",
            "0x",
            "1e",
            "e3",
            "1-2",
            "nan-node",
            "10.0.2.0/24",
            "a:b",
            "1:2:x",
        ] {
            assert!(!yaml::reads_as_non_string(word), "{word:?}");
            assert_eq!(yaml::to_string(&json!({"k": word})), format!("k: {word}\n"));
        }
        // A string with a quote in it keeps it, doubled.
        assert_eq!(yaml::to_string(&json!("o'n")), "o'n\n");
        assert_eq!(yaml::to_string(&json!(["1'0"])), "- 1'0\n");
    }

    #[test]
    fn yaml_output_reads_back_as_the_same_json_with_the_projects_reader() {
        let mut tricky = serde_json::Map::new();
        for word in YAML11_WORDS {
            tricky.insert((*word).to_string(), json!([*word, {*word: *word}]));
        }
        tricky.insert(
            "block".into(),
            json!({"on": "line\non\n\n  yes\n", "y": " lead\nx"}),
        );
        tricky.insert("it's".into(), json!("'quoted' \"both\" : # -"));
        tricky.insert(
            "nested".into(),
            json!([["on", {"off": []}], {}, [], null, 1.5, -0.0, true]),
        );
        tricky.insert("multi\nline key".into(), json!("v"));
        let mut docs = kubevirt_documents();
        docs.push(serde_json::Value::Object(tricky));
        for doc in &docs {
            let text = yaml::to_string(doc);
            let back = vmplane_core::types::parse_documents(text.as_bytes())
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(back.len(), 1, "{text}");
            assert_eq!(&back[0], doc, "{text}");
            // And as a section of a larger text (describe).
            let section = format!("x:\n{}", yaml::indented(doc, 2));
            let back = vmplane_core::types::parse_documents(section.as_bytes()).expect("section");
            assert_eq!(&back[0]["x"], doc, "{section}");
        }
    }

    #[test]
    fn yaml_layout_is_serde_yamls_byte_for_byte_but_for_the_quotes() {
        let mut docs = kubevirt_documents();
        docs.push(json!({"a": "multi\nline", "b": [" lead\nx", "t\n", ["x", {"k": "v", "k2": ["z"]}], {}],
            "c": {"d": "x\n\ny"}, "e": 1.0, "f": 1e300, "g": -0.0, "h": 12345678901234567890u64,
            "i": "'q'", "j": "a: b", "k": "#c", "l": " x", "m": "tab\there", "n": "\u{1}", "o": "é"}));
        docs.push(json!([[["deep"]], "x"]));
        docs.push(json!("top\nlevel"));
        docs.push(json!({}));
        for doc in &docs {
            assert_eq!(
                yaml::to_string_yaml12(doc),
                serde_yaml::to_string(doc).expect("serde_yaml"),
                "{doc}"
            );
        }
    }

    #[test]
    fn a_list_streamed_item_by_item_prints_as_the_whole_tree_would() {
        let items: Vec<pb::Object> = [
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"b","labels":{"z":"1","a":"2"}},"spec":{"runStrategy":"Halted"},"status":{"printableStatus":"Stopped"}}"#,
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},"spec":{"template":{"spec":{"domain":{"devices":{"disks":[{"name":"root"}]}}}}}}"#,
        ]
        .iter()
        .map(|json| pb::Object {
            kind: "VirtualMachine".into(),
            json: (*json).into(),
            ..Default::default()
        })
        .collect();
        let tree = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": items.iter().map(|o| parse(o).expect("json")).collect::<Vec<_>>(),
            "metadata": {"resourceVersion": "42"},
        });
        for format in [Output::Json, Output::Yaml] {
            let mut streamed = Vec::new();
            list(&mut streamed, Some(format), &items, 42).expect("list");
            let mut whole = Vec::new();
            value_to(&mut whole, format, &tree).expect("tree");
            assert_eq!(
                String::from_utf8(streamed).expect("utf-8"),
                String::from_utf8(whole).expect("utf-8"),
                "{format:?}"
            );
        }
        let broken = [pb::Object {
            kind: "VirtualMachine".into(),
            name: "x".into(),
            json: "{".into(),
            ..Default::default()
        }];
        let err = list(&mut Vec::new(), Some(Output::Json), &broken, 1).expect_err("bad json");
        assert!(format!("{err:#}").contains("VirtualMachine/x"), "{err:#}");
    }

    #[test]
    fn tables_line_up_on_the_widest_cell() {
        let mut out = Vec::new();
        table(
            &mut out,
            &["NAME", "STATUS"],
            &[
                vec!["a".into(), "Running".into()],
                vec!["longer-name".into(), "Stopped".into()],
            ],
        )
        .expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(
            text,
            "NAME          STATUS\na             Running\nlonger-name   Stopped\n"
        );
    }

    #[test]
    fn snapshots_restores_and_clones_list_with_kubevirts_printer_columns() {
        let obj = |kind: &str, name: &str, json: serde_json::Value| pb::Object {
            kind: kind.into(),
            name: name.into(),
            json: json.to_string(),
            ..Default::default()
        };
        // "5m" however long the test takes.
        let five_minutes_ago = (Utc::now() - chrono::Duration::seconds(300))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let text = |items: &[pb::Object]| {
            let mut out = Vec::new();
            object_table(&mut out, items, &TableOptions::default()).expect("write");
            String::from_utf8(out).expect("utf-8")
        };
        let snapshots = text(&[
            obj(
                "VirtualMachineSnapshot",
                "snap1",
                json!({"spec": {"source": {"kind": "VirtualMachine", "name": "demo"}},
                    "status": {"phase": "Succeeded", "readyToUse": true, "creationTime": five_minutes_ago}}),
            ),
            obj(
                "VirtualMachineSnapshot",
                "snap2",
                json!({"spec": {"source": {"kind": "VirtualMachine", "name": "gone"}},
                    "status": {"phase": "Failed", "readyToUse": false,
                        "error": {"message": "VirtualMachine default/gone does not exist"}}}),
            ),
        ]);
        // Each line's cells, one space apart.
        let squeezed = |text: &str| -> Vec<String> {
            text.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        assert_eq!(
            squeezed(&snapshots)[..2],
            [
                "NAME SOURCEKIND SOURCENAME PHASE READYTOUSE CREATIONTIME ERROR",
                "snap1 VirtualMachine demo Succeeded true 5m",
            ]
        );
        let lines: Vec<&str> = snapshots.lines().collect();
        assert!(
            lines[2].ends_with(
                "false                       VirtualMachine default/gone does not exist"
            ),
            "{snapshots}"
        );
        assert!(
            lines.iter().all(|l| l.trim_end() == *l),
            "no trailing blanks: {snapshots:?}"
        );
        let restores = text(&[obj(
            "VirtualMachineRestore",
            "r1",
            json!({"spec": {"target": {"kind": "VirtualMachine", "name": "demo2"}},
                "status": {"complete": true, "restoreTime": five_minutes_ago}}),
        )]);
        assert_eq!(
            squeezed(&restores),
            [
                "NAME TARGETKIND TARGETNAME COMPLETE RESTORETIME ERROR",
                "r1 VirtualMachine demo2 true 5m",
            ]
        );
        let clones = text(&[obj(
            "VirtualMachineClone",
            "c1",
            json!({"spec": {"source": {"kind": "VirtualMachine", "name": "demo"},
                "target": {"kind": "VirtualMachine", "name": "demo3"}},
                "status": {"phase": "Succeeded"}}),
        )]);
        assert_eq!(
            squeezed(&clones),
            [
                "NAME PHASE SOURCEVIRTUALMACHINE TARGETVIRTUALMACHINE",
                "c1 Succeeded demo demo3",
            ]
        );
    }

    #[test]
    fn wide_adds_columns_after_the_tables_own() {
        let vm = pb::Object {
            kind: "VirtualMachine".into(),
            name: "web".into(),
            generation: 2,
            resource_version: 41,
            json: json!({"spec": {"instancetype": {"name": "u1.medium"},
                    "preference": {"name": "fedora"},
                    "template": {"spec": {"domain": {"firmware": {"uuid": "u-1"}}}}},
                "status": {"printableStatus": "Stopped", "ready": false,
                    "runStrategy": "Halted", "firmwareUUIDOrigin": "Generated"}})
            .to_string(),
            ..Default::default()
        };
        let text = |wide: bool| {
            let mut out = Vec::new();
            let options = TableOptions {
                wide,
                ..TableOptions::default()
            };
            object_table(&mut out, std::slice::from_ref(&vm), &options).expect("write");
            String::from_utf8(out).expect("utf-8")
        };
        let squeezed = |text: String| -> Vec<String> {
            text.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        assert_eq!(
            squeezed(text(false)),
            [
                "NAME STATUS AGE GENERATION FIRMWARE-UUID",
                "web Stopped <unknown> 2 u-1"
            ]
        );
        assert_eq!(
            squeezed(text(true)),
            [
                "NAME STATUS AGE GENERATION FIRMWARE-UUID READY RUN-STRATEGY INSTANCETYPE \
                 PREFERENCE UUID-ORIGIN RESOURCE-VERSION",
                "web Stopped <unknown> 2 u-1 false Halted u1.medium fedora Generated 41",
            ]
        );
    }

    #[test]
    fn label_columns_and_show_labels_come_last_as_in_kubectl() {
        let obj = |name: &str, labels: serde_json::Value| pb::Object {
            kind: "Instancetype".into(),
            name: name.into(),
            generation: 1,
            json: json!({"metadata": {"labels": labels}}).to_string(),
            ..Default::default()
        };
        let items = [
            obj(
                "small",
                json!({"app.kubernetes.io/name": "web", "tier": "front"}),
            ),
            obj("plain", json!({})),
        ];
        let mut out = Vec::new();
        let options = TableOptions {
            label_columns: vec!["app.kubernetes.io/name".into(), "zone".into()],
            show_labels: true,
            ..TableOptions::default()
        };
        object_table(&mut out, &items, &options).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["NAME", "AGE", "GENERATION", "NAME", "ZONE", "LABELS"],
                vec![
                    "small",
                    "<unknown>",
                    "1",
                    "web",
                    "app.kubernetes.io/name=web,tier=front"
                ],
                vec!["plain", "<unknown>", "1", "<none>"],
            ]
        );
        // The label columns line up under their headers.
        let header = text.lines().next().expect("header");
        let row = text.lines().nth(1).expect("row");
        assert_eq!(header.rfind("NAME"), row.find("web"));
    }

    #[test]
    fn describe_shows_the_object_then_its_latest_events() {
        let obj = pb::Object {
            kind: "VirtualMachine".into(),
            namespace: "team-a".into(),
            name: "web".into(),
            uid: "u-1".into(),
            generation: 2,
            resource_version: 7,
            json: json!({"metadata": {"labels": {"app": "web", "tier": "front"}},
                "spec": {"runStrategy": "Halted"},
                "status": {"printableStatus": "Stopped"}})
            .to_string(),
        };
        let revision = |n: u64, event: &str| pb::Revision {
            revision: n,
            first_revision: n,
            position: n,
            generation: 1,
            time: "2026-11-22T12:00:00Z".into(),
            actor: "alice".into(),
            events: vec![event.into()],
            summary: format!("{event} summary"),
        };
        let revisions = [
            revision(1, "VmCreated"),
            revision(2, "VmSpecEdited"),
            revision(3, "VmStartRequested"),
        ];
        let text = |events: usize| {
            let mut out = Vec::new();
            describe(&mut out, &obj, &revisions, events).expect("write");
            String::from_utf8(out).expect("utf-8")
        };
        let all = text(0);
        for line in [
            "Name:              web",
            "Namespace:         team-a",
            "Kind:              VirtualMachine",
            "Generation:        2",
            "Resource Version:  7",
            "Labels:            app=web\n                   tier=front",
            "Annotations:       <none>",
            "Spec:\n  runStrategy: Halted\n",
            "Status:\n  printableStatus: Stopped\n",
            "Events:\n  REVISION   AGE",
        ] {
            assert!(all.contains(line), "{line:?} in:\n{all}");
        }
        assert_eq!(all.matches("alice").count(), 3, "{all}");
        let latest = text(2);
        assert!(
            latest.contains(
                "Events:            the latest 2 of 3 (all: vmplane history virtualmachine web \
                 -n team-a)"
            ),
            "{latest}"
        );
        assert!(
            !latest.contains("VmCreated") && latest.contains("VmStartRequested"),
            "{latest}"
        );
        let mut out = Vec::new();
        describe(&mut out, &obj, &[], 20).expect("write");
        assert!(
            String::from_utf8(out)
                .expect("utf-8")
                .ends_with("Events:            <none>\n")
        );
        assert!(!all.contains("Deletion:"), "{all}");
        // A VM being deleted says since when.
        let going = pb::Object {
            json: json!({"metadata": {"deletionTimestamp": "2026-11-22T12:00:00Z"},
                "status": {"printableStatus": "Terminating"}})
            .to_string(),
            ..obj.clone()
        };
        let mut out = Vec::new();
        describe(&mut out, &going, &[], 20).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(
            text.contains("Deletion:          requested 2026-11-22T12:00:00Z ("),
            "{text}"
        );
    }

    #[test]
    fn a_saga_failure_is_read_from_whichever_place_its_kind_keeps_the_reason() {
        // A clone: phase Failed, the reason in its conditions' message.
        let clone = json!({"phase": "Failed", "conditions": [
            {"type": "Progressing", "status": "False", "reason": "Failed", "message": "VirtualMachine demo2 already exists in namespace default"},
            {"type": "Ready", "status": "False", "reason": "Failed", "message": "VirtualMachine demo2 already exists in namespace default"}]});
        assert_eq!(
            saga_failure(&clone).as_deref(),
            Some("VirtualMachine demo2 already exists in namespace default")
        );
        // A snapshot: a Failure condition with a reason code, the sentence in `error`.
        let snapshot = json!({"phase": "Failed", "error": {"message": "VirtualMachine default/x does not exist"},
            "conditions": [{"type": "Failure", "status": "True", "reason": "SourceDoesNotExist"}]});
        assert_eq!(
            saga_failure(&snapshot).as_deref(),
            Some("VirtualMachine default/x does not exist")
        );
        // A restore: a Failure condition only.
        let restore = json!({"conditions": [{"type": "Failure", "status": "True", "reason": "RestoreFailed"}]});
        assert_eq!(saga_failure(&restore).as_deref(), Some("RestoreFailed"));
        // Still running, or done: no failure.
        let running = json!({"phase": "InProgress", "conditions": [{"type": "Ready", "status": "False", "message": "Still processing"}]});
        assert_eq!(saga_failure(&running), None);
        assert_eq!(saga_failure(&json!({"phase": "Succeeded"})), None);
        assert_eq!(
            saga_failure(&json!({"phase": "Failed"})).as_deref(),
            Some("failed")
        );
    }

    #[test]
    fn age_reads_like_kubectl() {
        let now = DateTime::parse_from_rfc3339("2026-11-22T12:00:00Z")
            .expect("t")
            .with_timezone(&Utc);
        assert_eq!(age(Some("2026-11-22T11:59:18Z"), now), "42s");
        assert_eq!(age(Some("2026-11-22T11:55:00Z"), now), "5m");
        assert_eq!(age(Some("2026-11-22T09:00:00Z"), now), "3h");
        assert_eq!(age(Some("2026-11-10T12:00:00Z"), now), "12d");
        assert_eq!(age(None, now), "<unknown>");
    }

    #[test]
    fn a_list_carries_its_read_position_as_resource_version() {
        let obj = pb::Object {
            kind: "VirtualMachine".into(),
            name: "demo".into(),
            json: r#"{"kind":"VirtualMachine","metadata":{"name":"demo"}}"#.into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        list(&mut out, Some(Output::Json), &[obj], 42).expect("write");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["kind"], "List");
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["items"][0]["metadata"]["name"], "demo");
    }
}
