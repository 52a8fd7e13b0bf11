//! Aggregates: `decide(state, command, ctx) -> Result<Decision, Rejection>` and
//! `evolve(state, &event) -> state`, one module per kind of stream.
//!
//! * [`vm`] — `vm/<ns>/<name>`: the VM object, its firmware identity, its captured
//!   instancetype/preference revisions, **and the lifecycle of its VMI runs** (start/stop
//!   requests, launches, phases, crash-loop backoff). Keeping the runs in the VM's stream lets
//!   one `decide` see both the spec and the run it judges (start rules, RestartRequired), and
//!   lets projections derive status from one fold.
//! * [`vmi`] — `vmi/<ns>/<name>`: standalone VMIs (no VM).
//! * [`object`] — instancetypes, preferences (both scopes) and the KubeVirt cluster
//!   configuration: create/update/delete of a versioned object (also the first event of the
//!   snapshot, restore and clone streams).
//! * [`snapshot`] — `snapshot/<ns>/<name>`: a VM captured at one log position.
//! * [`restore`] — `restore/<ns>/<name>`: a snapshot put back onto its VM or into a new VM, a
//!   saga with the target VM stream.
//! * [`clone`] — `clone/<ns>/<name>`: a VM or snapshot copied into a new VM with a new
//!   identity, the same saga shape.
//! * [`dataprotection`] — what those three share: [`dataprotection::Next`],
//!   [`dataprotection::SagaDecision`], spec views, KubeVirt's filters and conditions.

pub mod clone;
pub mod dataprotection;
pub mod object;
pub mod restore;
pub mod snapshot;
pub mod vm;
pub mod vmi;

use crate::decision::Claim;
use crate::event::Event;

/// Collects the events of one decision, folding each into a scratch state so later checks see
/// the effect of earlier events.
pub(crate) struct Emitter<S> {
    pub(crate) state: S,
    pub(crate) events: Vec<Event>,
    pub(crate) claims: Vec<Claim>,
    evolve: fn(S, &Event) -> S,
}

impl<S: Default> Emitter<S> {
    pub(crate) fn new(state: S, evolve: fn(S, &Event) -> S) -> Self {
        Emitter {
            state,
            events: Vec::new(),
            claims: Vec::new(),
            evolve,
        }
    }

    pub(crate) fn emit(&mut self, e: Event) {
        let state = std::mem::take(&mut self.state);
        self.state = (self.evolve)(state, &e);
        self.events.push(e);
    }

    /// [`Emitter::emit`], the state evolved by `evolve`, which gives the state the emitter's
    /// own evolve function would: for a decider that holds typed what the event carries as
    /// text, so the state is not parsed back from it.
    pub(crate) fn emit_evolved(&mut self, e: Event, evolve: impl FnOnce(S, &Event) -> S) {
        let state = std::mem::take(&mut self.state);
        self.state = evolve(state, &e);
        self.events.push(e);
    }

    pub(crate) fn claim(&mut self, c: Claim) {
        self.claims.push(c);
    }

    pub(crate) fn finish(self, outcome: crate::decision::Outcome) -> crate::decision::Decision {
        self.finish_with(outcome, |_| None)
    }

    /// The decision, `vm_after` what `keep` makes of the state its events lead to.
    fn finish_with(
        self,
        outcome: crate::decision::Outcome,
        keep: impl FnOnce(S) -> Option<Box<vm::VmState>>,
    ) -> crate::decision::Decision {
        if self.events.is_empty() {
            return crate::decision::Decision::unchanged();
        }
        crate::decision::Decision {
            events: self.events,
            claims: self.claims,
            outcome,
            vm_after: keep(self.state),
        }
    }
}

impl Emitter<vm::VmState> {
    /// [`Emitter::finish`], the decision carrying the VM state its events lead to.
    pub(crate) fn finish_vm(self, outcome: crate::decision::Outcome) -> crate::decision::Decision {
        self.finish_with(outcome, |state| Some(Box::new(state)))
    }
}
