//! The standalone VMI aggregate: stream `vmi/<namespace>/<name>` (a VMI without a VM; the VMI
//! runs of a VM live in the VM's stream).

use uuid::Uuid;

use super::Emitter;
use super::vm::{Existence, VmiObservation};
use crate::ctx::Ctx;
use crate::decision::{Claim, Decision, Outcome, streams};
use crate::defaults;
use crate::error::{Category, Cause, Rejection, codes};
use crate::event::*;
use crate::firmware::{FirmwareIdentity, claim_key};
use crate::types::VirtualMachineInstance;
use crate::validate;

/// The folded state of a `vmi/<ns>/<name>` stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VmiState {
    /// Events folded.
    pub revision: u64,
    /// Never / Live / Deleted.
    pub existence: Existence,
    /// uid of the current (or last) VMI.
    pub uid: Option<Uuid>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The stored object (effective firmware UUID included).
    pub vmi: Option<VirtualMachineInstance>,
    /// The firmware identity.
    pub firmware: Option<FirmwareIdentity>,
    /// Last observed phase (`Pending` at creation).
    pub phase: Option<VmiPhase>,
    /// Node.
    pub node: Option<String>,
    /// Reason of the last observation.
    pub reason: Option<String>,
    /// Message of the last observation (why it is unschedulable, why it failed, …).
    pub message: Option<String>,
    /// Events whose JSON could not be read.
    pub unreadable_events: u64,
}

impl VmiState {
    /// Whether a VMI lives under this name.
    pub fn is_live(&self) -> bool {
        self.existence == Existence::Live
    }
}

/// Commands on a standalone VMI.
#[derive(Debug, Clone, PartialEq)]
pub enum VmiCommand {
    /// Create (AlreadyExists if live).
    Create(Box<VirtualMachineInstance>),
    /// Create, or nothing if the same manifest is live (a VMI spec is immutable).
    Apply(Box<VirtualMachineInstance>),
    /// Delete.
    Delete,
    /// The reconciler saw it do something.
    Observe(VmiObservation),
}

/// Decides a command on a standalone VMI.
pub fn decide(
    state: &VmiState,
    command: &VmiCommand,
    ctx: &mut Ctx,
) -> Result<Decision, Rejection> {
    match command {
        VmiCommand::Create(v) | VmiCommand::Apply(v) => {
            let mut vmi = (**v).clone();
            defaults::normalize_meta(&mut vmi.metadata, true);
            vmi.status = None;
            if state.is_live() {
                if matches!(command, VmiCommand::Create(_)) {
                    return Err(Rejection::one(
                        Category::AlreadyExists,
                        Cause::new(
                            "metadata.name",
                            codes::ALREADY_EXISTS,
                            format!(
                                "virtualmachineinstances.kubevirt.io \"{}\" already exists",
                                state.name
                            ),
                        ),
                    ));
                }
                if let Some(fw) = &state.firmware {
                    let f = vmi
                        .spec
                        .domain
                        .firmware
                        .get_or_insert_with(Default::default);
                    f.uuid.get_or_insert_with(|| fw.uuid.to_string());
                }
                let same = serde_json::to_value(&vmi).ok()
                    == state
                        .vmi
                        .as_ref()
                        .and_then(|x| serde_json::to_value(x).ok());
                return if same {
                    Ok(Decision::unchanged())
                } else {
                    Err(Rejection::invalid(
                        "spec",
                        codes::INVALID_VALUE,
                        "Updating a VirtualMachineInstance spec is not allowed; delete and create it",
                    ))
                };
            }
            validate::vmi(&vmi)?;
            let uid = ctx.new_uuid_v4();
            let given = vmi
                .spec
                .domain
                .firmware
                .as_ref()
                .and_then(|f| f.uuid.as_deref())
                .and_then(|u| Uuid::parse_str(u).ok());
            // Row 12: a standalone VMI without a UUID gets a random v4 at creation.
            let (fw_uuid, origin) = match given {
                Some(u) => (u, FirmwareOrigin::UserSpecified),
                None => (ctx.new_uuid_v4(), FirmwareOrigin::Generated),
            };
            vmi.spec
                .domain
                .firmware
                .get_or_insert_with(Default::default)
                .uuid = Some(fw_uuid.to_string());
            let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
            let name = vmi.metadata.name.clone().unwrap_or_default();
            let mut em = Emitter::new(state.clone(), evolve);
            em.emit(Event::VmiCreated(VmiCreated {
                uid,
                namespace: namespace.clone(),
                name: name.clone(),
                manifest_json: serde_json::to_string(&vmi).unwrap_or_default(),
                firmware_uuid: fw_uuid,
                firmware_origin: origin,
            }));
            em.claim(Claim::Acquire {
                key: claim_key(&fw_uuid),
                owner: streams::vmi(&namespace, &name),
            });
            Ok(em.finish(Outcome::Created))
        }
        VmiCommand::Delete => {
            if !state.is_live() {
                return Err(Rejection::not_found(
                    "metadata.name",
                    codes::NOT_FOUND,
                    format!(
                        "virtualmachineinstances.kubevirt.io \"{}\" not found",
                        state.name
                    ),
                ));
            }
            let mut em = Emitter::new(state.clone(), evolve);
            em.emit(Event::VmiDeleted(VmiDeleted {
                uid: state.uid.unwrap_or_default(),
            }));
            if let Some(fw) = &state.firmware {
                em.claim(Claim::Release {
                    key: claim_key(&fw.uuid),
                    owner: streams::vmi(&state.namespace, &state.name),
                });
            }
            Ok(em.finish(Outcome::Deleted))
        }
        VmiCommand::Observe(obs) => {
            if !state.is_live() {
                return Err(Rejection::precondition(
                    codes::STALE_OBSERVATION,
                    "the VMI does not exist",
                ));
            }
            let uid = state.uid.unwrap_or_default();
            let phase = state.phase.unwrap_or(VmiPhase::Pending);
            let now = ctx.now_ms();
            let mut em = Emitter::new(state.clone(), evolve);
            match obs {
                VmiObservation::Removed => return Ok(Decision::unchanged()),
                VmiObservation::Scheduled { node } => {
                    if phase.is_final() {
                        return Err(Rejection::precondition(
                            codes::STALE_OBSERVATION,
                            "final phases are sticky",
                        ));
                    }
                    if state.node.as_deref() == Some(node) {
                        return Ok(Decision::unchanged());
                    }
                    em.emit(Event::VmiScheduled(VmiScheduled {
                        vmi_uid: uid,
                        node: node.clone(),
                        at_ms: now,
                    }));
                }
                VmiObservation::Phase {
                    phase: p,
                    reason,
                    message,
                } => {
                    if *p == phase && *reason == state.reason && *message == state.message {
                        return Ok(Decision::unchanged());
                    }
                    if phase.is_final()
                        || (*p < phase && *p != VmiPhase::Unknown && phase != VmiPhase::Unknown)
                    {
                        return Err(Rejection::precondition(
                            codes::STALE_OBSERVATION,
                            format!("VMI cannot go from {} to {}", phase.as_str(), p.as_str()),
                        ));
                    }
                    em.emit(Event::VmiPhaseObserved(VmiPhaseObserved {
                        vmi_uid: uid,
                        phase: *p,
                        reason: reason.clone(),
                        message: message.clone(),
                        at_ms: now,
                    }));
                }
            }
            Ok(em.finish(Outcome::Recorded))
        }
    }
}

/// Folds one event into the state.
pub fn evolve(mut s: VmiState, event: &Event) -> VmiState {
    s.revision += 1;
    match event {
        Event::VmiCreated(e) => {
            s.existence = Existence::Live;
            s.uid = Some(e.uid);
            s.namespace.clone_from(&e.namespace);
            s.name.clone_from(&e.name);
            s.vmi = serde_json::from_str(&e.manifest_json).ok();
            if s.vmi.is_none() {
                s.unreadable_events += 1;
            }
            s.firmware = Some(FirmwareIdentity {
                uuid: e.firmware_uuid,
                serial: None,
                origin: e.firmware_origin,
            });
            s.phase = Some(VmiPhase::Pending);
            s.node = None;
            s.reason = None;
            s.message = None;
        }
        Event::VmiDeleted(_) => s.existence = Existence::Deleted,
        Event::VmiScheduled(e) if Some(e.vmi_uid) == s.uid => {
            s.node = Some(e.node.clone());
            if s.phase.is_none_or(|p| p < VmiPhase::Scheduled) {
                s.phase = Some(VmiPhase::Scheduled);
            }
        }
        Event::VmiPhaseObserved(e) if Some(e.vmi_uid) == s.uid => {
            s.phase = Some(e.phase);
            s.reason.clone_from(&e.reason);
            s.message.clone_from(&e.message);
        }
        _ => {}
    }
    s
}
