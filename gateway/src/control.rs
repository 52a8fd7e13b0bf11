//! The reconciler's view of the control plane, over the projections (desired state) and the
//! command path (where its observations are recorded, as principal `system:reconciler`).

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};

use uuid::Uuid;
use vmplane_core::types::Kind;
use vmplane_core::{Features, VmCommand, VmState, VmiCommand, VmiState};
use vmplane_hypervisor::control_plane::{
    ControlPlane, ControlPlaneError, Executed, RECONCILER_ACTOR,
};
use vmplane_projections::Projections;
use vmplane_projections::command::{Command, CommandError, CommandHandler, CommandMeta};
use vmplane_projections::model::AggState;
use vmplane_store::{EventLog, Position};

/// The VMI uids the log recorded up to a position (see [`ControlPlane::recorded_vmis`]).
#[derive(Default)]
struct RecordedVmis {
    /// Events up to here are in `uids`.
    after: Position,
    uids: HashSet<Uuid>,
}

impl RecordedVmis {
    /// Reads the VMI uids of the events after `self.after` (`VmiLaunched`: a VM's run;
    /// `VmiCreated`: a standalone VMI). Only those two types are decoded.
    fn catch_up(&mut self, log: &dyn EventLog) -> Result<(), ControlPlaneError> {
        let mut failed = None;
        let mut uids = std::mem::take(&mut self.uids);
        let scanned = log.scan(self.after, &mut |e| {
            if matches!(e.event_type, "VmiLaunched" | "VmiCreated") {
                match vmplane_core::decode(e.event_type, e.schema_version, e.payload) {
                    Ok(vmplane_core::Event::VmiLaunched(p)) => {
                        uids.insert(p.vmi_uid);
                    }
                    Ok(vmplane_core::Event::VmiCreated(p)) => {
                        uids.insert(p.uid);
                    }
                    Ok(_) => {}
                    Err(err) => {
                        failed = Some(format!("event at position {}: {err}", e.position.0));
                        return ControlFlow::Break(());
                    }
                }
            }
            ControlFlow::Continue(())
        });
        self.uids = uids;
        if let Some(failed) = failed {
            return Err(unavailable(failed));
        }
        self.after = scanned.map_err(unavailable)?;
        Ok(())
    }
}

/// [`ControlPlane`] over a server's projections and command path.
pub struct ServerControlPlane {
    projections: Arc<Projections>,
    commands: Arc<CommandHandler>,
    /// `Some(reason)` once this server's leadership term is over (see `leader`).
    term_over: Arc<dyn Fn() -> Option<String> + Send + Sync>,
    /// The VMI uids the log recorded, read from the log when a lookup misses.
    recorded: Mutex<RecordedVmis>,
}

impl ServerControlPlane {
    /// The reconciler reads `projections` and records through `commands`.
    pub fn new(projections: Arc<Projections>, commands: Arc<CommandHandler>) -> Self {
        ServerControlPlane {
            projections,
            commands,
            term_over: Arc::new(|| None),
            recorded: Mutex::new(RecordedVmis::default()),
        }
    }

    /// The same, for one leadership term: once `term_over` says the term ended, every method
    /// fails with `Unavailable`, so a pass in progress stops acting. (`commands` should append
    /// through the term's `FencedLog`: that check, in the store's transaction, is the one that
    /// holds even when this process does not yet know it was deposed.)
    #[must_use]
    pub fn with_term(mut self, term_over: Arc<dyn Fn() -> Option<String> + Send + Sync>) -> Self {
        self.term_over = term_over;
        self
    }

    fn leading(&self) -> Result<(), ControlPlaneError> {
        match (self.term_over)() {
            Some(reason) => Err(ControlPlaneError::Unavailable(format!(
                "this server no longer leads the reconciler: {reason}"
            ))),
            None => Ok(()),
        }
    }

    fn meta() -> CommandMeta {
        CommandMeta {
            actor: RECONCILER_ACTOR.to_string(),
            ..CommandMeta::default()
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Unavailable(e.to_string())
}

fn from_command(e: CommandError) -> ControlPlaneError {
    match e {
        CommandError::Rejected(r) => ControlPlaneError::Rejected(r),
        other => unavailable(other),
    }
}

impl ControlPlane for ServerControlPlane {
    fn vms(&self) -> Result<Vec<VmState>, ControlPlaneError> {
        self.leading()?;
        let states = self
            .projections
            .states_of(Kind::VirtualMachine)
            .map_err(unavailable)?;
        Ok(states
            .iter()
            .filter_map(|s| match &s.state {
                AggState::Vm(vm) if vm.is_live() || vm.run.vmi.is_some() => Some((**vm).clone()),
                _ => None,
            })
            .collect())
    }

    fn standalone_vmis(&self) -> Result<Vec<VmiState>, ControlPlaneError> {
        self.leading()?;
        let states = self
            .projections
            .states_of(Kind::VirtualMachineInstance)
            .map_err(unavailable)?;
        Ok(states
            .iter()
            .filter_map(|s| match &s.state {
                AggState::Vmi(vmi) => Some((**vmi).clone()),
                _ => None,
            })
            .collect())
    }

    fn features(&self) -> Result<Features, ControlPlaneError> {
        Ok((*self.projections.features_at(None).map_err(unavailable)?).clone())
    }

    /// Answered from the uids read so far; the log is read on (from where the last read
    /// stopped) only when one of `uids` is not among them. The reconciler asks only about the
    /// domains no VM or VMI wants, so a log with no foreign domains is read once per term at
    /// most.
    fn recorded_vmis(&self, uids: &[Uuid]) -> Result<HashSet<Uuid>, ControlPlaneError> {
        self.leading()?;
        let mut recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        if uids.iter().any(|u| !recorded.uids.contains(u)) {
            recorded.catch_up(self.projections.log().as_ref())?;
        }
        Ok(uids
            .iter()
            .filter(|u| recorded.uids.contains(u))
            .copied()
            .collect())
    }

    fn execute(
        &self,
        namespace: &str,
        name: &str,
        command: VmCommand,
    ) -> Result<Executed<VmState>, ControlPlaneError> {
        let command = Command::Vm {
            namespace: namespace.into(),
            name: name.into(),
            command,
        };
        self.execute_and_reload(command, Kind::VirtualMachine, |state| match state {
            AggState::Vm(vm) => Some((**vm).clone()),
            _ => None,
        })
    }

    fn execute_vmi(
        &self,
        namespace: &str,
        name: &str,
        command: VmiCommand,
    ) -> Result<Executed<VmiState>, ControlPlaneError> {
        let command = Command::Vmi {
            namespace: namespace.into(),
            name: name.into(),
            command,
        };
        self.execute_and_reload(command, Kind::VirtualMachineInstance, |state| match state {
            AggState::Vmi(vmi) => Some((**vmi).clone()),
            _ => None,
        })
    }
}

impl ServerControlPlane {
    /// Runs `command` as the reconciler, then reloads its stream's state (`pick` takes the
    /// aggregate of the expected kind out of it).
    fn execute_and_reload<S>(
        &self,
        command: Command,
        kind: Kind,
        pick: impl FnOnce(&AggState) -> Option<S>,
    ) -> Result<Executed<S>, ControlPlaneError> {
        self.leading()?;
        let stream = command.stream();
        let done = self
            .commands
            .execute(&Self::meta(), command)
            .map_err(from_command)?;
        let (snapshot, _) = self.commands.load(&stream, kind).map_err(unavailable)?;
        let state = pick(&snapshot.state)
            .ok_or_else(|| unavailable(format!("{stream} is not a {} stream", kind.as_str())))?;
        Ok(Executed {
            state,
            events_appended: appended(&done),
        })
    }
}

fn appended(done: &vmplane_projections::command::Executed) -> usize {
    done.append
        .filter(|a| !a.replayed)
        .map_or(0, |a| (a.last_position.0 + 1 - a.first_position.0) as usize)
}
