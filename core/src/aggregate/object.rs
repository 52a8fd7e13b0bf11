//! The simple object aggregate: create/update/delete of a versioned object, for
//! instancetypes and preferences (streams `instancetype/<ns>/<name>`,
//! `clusterinstancetype/<name>`, `preference/<ns>/<name>`, `clusterpreference/<name>`),
//! and the KubeVirt cluster configuration (`cluster/config`); every version is kept as an event
//! so any revision can be read back. Snapshots, restores and clones
//! (`snapshot|restore|clone/<ns>/<name>`) start with this aggregate's `ObjectCreated` and
//! continue with their own events ([`crate::aggregate::snapshot`], [`crate::aggregate::restore`],
//! [`crate::aggregate::clone`]); their `evolve` wraps this one.

use uuid::Uuid;

use super::Emitter;
use super::vm::Existence;
use crate::ctx::Ctx;
use crate::decision::{Decision, Outcome};
use crate::defaults;
use crate::error::{Category, Cause, Rejection, codes};
use crate::event::*;
use crate::types::{Kind, Manifest};
use crate::validate;

/// The folded state of an object stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectState {
    /// Events folded.
    pub revision: u64,
    /// Creations and updates so far (`metadata.generation`).
    pub generation: u64,
    /// Never / Live / Deleted.
    pub existence: Existence,
    /// The kind.
    pub kind: Option<Kind>,
    /// uid of the current (or last) life.
    pub uid: Option<Uuid>,
    /// Namespace (None for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// The stored object.
    pub object: Option<Manifest>,
    /// Events whose JSON could not be read.
    pub unreadable_events: u64,
}

impl ObjectState {
    /// Whether an object lives under this name.
    pub fn is_live(&self) -> bool {
        self.existence == Existence::Live
    }

    /// The stored object with uid and generation filled (the caller adds resourceVersion).
    pub fn render(&self) -> Option<Manifest> {
        if !self.is_live() {
            return None;
        }
        let mut v = self.object.as_ref()?.to_value();
        if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.insert(
                "uid".into(),
                serde_json::json!(self.uid.map(|u| u.to_string())),
            );
            meta.insert("generation".into(), serde_json::json!(self.generation));
        }
        Manifest::from_value(v).ok()
    }
}

/// Commands on an object stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectCommand {
    /// Create (AlreadyExists if live).
    Create(Box<Manifest>),
    /// Update (NotFound if not live), optionally at an expected generation.
    Update(Box<Manifest>, Option<u64>),
    /// Create or update.
    Apply(Box<Manifest>, Option<u64>),
    /// Delete, optionally at an expected generation.
    Delete(Option<u64>),
}

fn validate_manifest(m: &Manifest) -> Result<(), Rejection> {
    match m {
        Manifest::Instancetype(o) => validate::instancetype(o),
        Manifest::Preference(o) => validate::preference(o),
        Manifest::Object(Kind::KubeVirt, o) => validate::kubevirt(o),
        Manifest::Object(k, o) if k.managed() => validate::object(o, k.namespaced()),
        Manifest::Object(k, _) => Err(Rejection::invalid(
            "kind",
            codes::UNSUPPORTED_KIND,
            format!("kind {k} is parsed but not managed by vmplane"),
        )),
        Manifest::VirtualMachine(_) | Manifest::VirtualMachineInstance(_) => {
            Err(Rejection::invalid(
                "kind",
                codes::UNSUPPORTED_KIND,
                "VMs and VMIs have their own aggregates",
            ))
        }
    }
}

fn normalized(m: &Manifest) -> Manifest {
    let mut m = m.clone();
    let kind = m.kind();
    let meta = match &mut m {
        Manifest::Instancetype(o) => &mut o.metadata,
        Manifest::Preference(o) => &mut o.metadata,
        Manifest::Object(_, o) => {
            o.status = None;
            &mut o.metadata
        }
        Manifest::VirtualMachine(o) => &mut o.metadata,
        Manifest::VirtualMachineInstance(o) => &mut o.metadata,
    };
    defaults::normalize_meta(meta, kind.namespaced());
    m
}

/// Decides a command on an object stream.
pub fn decide(
    state: &ObjectState,
    command: &ObjectCommand,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    let (manifest, expected, create_only, update_only) = match command {
        ObjectCommand::Create(m) => (Some(m), None, true, false),
        ObjectCommand::Update(m, g) => (Some(m), *g, false, true),
        ObjectCommand::Apply(m, g) => (Some(m), *g, false, false),
        ObjectCommand::Delete(g) => (None, *g, false, false),
    };
    if let Some(g) = expected
        && g != state.generation
    {
        return Err(Rejection::conflict(g, state.generation));
    }
    let mut em = Emitter::new(state.clone(), evolve);
    let Some(m) = manifest else {
        if !state.is_live() {
            return Err(Rejection::not_found(
                "metadata.name",
                codes::NOT_FOUND,
                format!("\"{}\" not found", state.name),
            ));
        }
        em.emit(Event::ObjectDeleted(ObjectDeleted {
            uid: state.uid.unwrap_or_default(),
        }));
        return Ok(em.finish(Outcome::Deleted));
    };
    let m = normalized(m);
    validate_manifest(&m)?;
    let name = m.metadata().name_str().to_owned();
    if state.existence != Existence::Never && (name != state.name || Some(m.kind()) != state.kind) {
        return Err(Rejection::invalid(
            "metadata.name",
            codes::NAME_MISMATCH,
            format!(
                "manifest names {} {name}, the stream holds {}",
                m.kind(),
                state.name
            ),
        ));
    }
    let json = serde_json::to_string(&m.to_value()).unwrap_or_default();
    if state.is_live() {
        if create_only {
            return Err(Rejection::one(
                Category::AlreadyExists,
                Cause::new(
                    "metadata.name",
                    codes::ALREADY_EXISTS,
                    format!("{} \"{name}\" already exists", m.kind()),
                ),
            ));
        }
        if state.object.as_ref().map(Manifest::to_value) == Some(m.to_value()) {
            return Ok(Decision::unchanged());
        }
        em.emit(Event::ObjectUpdated(ObjectUpdated {
            manifest_json: json,
        }));
        return Ok(em.finish(Outcome::Configured));
    }
    if update_only {
        return Err(Rejection::not_found(
            "metadata.name",
            codes::NOT_FOUND,
            format!("{} \"{name}\" not found", m.kind()),
        ));
    }
    em.emit(Event::ObjectCreated(ObjectCreated {
        kind: m.kind().as_str().to_owned(),
        uid: ctx.new_uuid_v4(),
        namespace: m.metadata().namespace.clone(),
        name,
        manifest_json: json,
    }));
    Ok(em.finish(Outcome::Created))
}

fn parse(json: &str) -> Option<Manifest> {
    Manifest::from_value(serde_json::from_str(json).ok()?).ok()
}

/// Folds one event into the state.
pub fn evolve(mut s: ObjectState, event: &Event) -> ObjectState {
    s.revision += 1;
    match event {
        Event::ObjectCreated(e) => {
            s.existence = Existence::Live;
            // A new object (also one re-created under a deleted one's name): generation 1.
            s.generation = 1;
            s.kind = Kind::ALL.into_iter().find(|k| k.as_str() == e.kind);
            s.uid = Some(e.uid);
            s.namespace.clone_from(&e.namespace);
            s.name.clone_from(&e.name);
            s.object = parse(&e.manifest_json);
            if s.object.is_none() {
                s.unreadable_events += 1;
            }
        }
        Event::ObjectUpdated(e) => {
            s.generation += 1;
            match parse(&e.manifest_json) {
                Some(o) => s.object = Some(o),
                None => s.unreadable_events += 1,
            }
        }
        Event::ObjectDeleted(_) => s.existence = Existence::Deleted,
        _ => {}
    }
    s
}
