//! Shared helpers: a real SledLog in a temp dir, VM manifests, and one `check_*` entry per area.
#![allow(dead_code)]

#[path = "../../../tests/testdata_dir.rs"]
mod testdata_dir;

use std::path::Path;
use std::sync::Arc;

use vmplane_core::types::{Manifest, VirtualMachine, parse_manifest};
use vmplane_core::{VmCommand, vm::PutVm};
use vmplane_projections::{
    Command, CommandHandler, CommandMeta, CommandOptions, Executed, ProjectionOptions, Projections,
};
use vmplane_store::{EventLog, SledLog};

pub struct Env {
    pub dir: tempfile::TempDir,
    pub log: Arc<dyn EventLog>,
    pub projections: Projections,
    pub commands: CommandHandler,
}

pub fn options() -> ProjectionOptions {
    ProjectionOptions {
        checkpoint_every_events: 0,
        ..ProjectionOptions::default()
    }
}

pub fn env() -> Env {
    env_over(|log| log)
}

/// [`env`] over a log whose committer thread runs, so it takes submitted appends
/// (`EventLog::submit`) as the server's does.
pub fn env_submitting() -> Env {
    env_over(|log| {
        log.start_committer().expect("start the committer");
        log
    })
}

fn env_over(prepare: impl FnOnce(Arc<SledLog>) -> Arc<SledLog>) -> Env {
    let dir = tempfile::tempdir().expect("temp dir");
    let log: Arc<dyn EventLog> = prepare(Arc::new(
        SledLog::open(dir.path().join("log")).expect("open log"),
    ));
    let projections = Projections::open(Arc::clone(&log), dir.path(), options()).expect("open");
    let commands = CommandHandler::new(
        Arc::clone(&log),
        Arc::clone(projections.cache()),
        CommandOptions::default(),
    );
    Env {
        dir,
        log,
        projections,
        commands,
    }
}

impl Env {
    /// Reopens the log and projections from the same data dir (a restart).
    pub fn restart(self) -> Env {
        self.reopen(|log| log)
    }

    /// [`Env::restart`] with the log's committer started, as [`env_submitting`] has it.
    pub fn restart_submitting(self) -> Env {
        self.reopen(|log| {
            log.start_committer().expect("start the committer");
            log
        })
    }

    fn reopen(self, prepare: impl FnOnce(Arc<SledLog>) -> Arc<SledLog>) -> Env {
        let Env {
            dir,
            log,
            projections,
            commands,
        } = self;
        drop((projections, commands, log));
        let log: Arc<dyn EventLog> = prepare(Arc::new(
            SledLog::open(dir.path().join("log")).expect("reopen log"),
        ));
        let projections =
            Projections::open(Arc::clone(&log), dir.path(), options()).expect("reopen");
        let commands = CommandHandler::new(
            Arc::clone(&log),
            Arc::clone(projections.cache()),
            CommandOptions::default(),
        );
        Env {
            dir,
            log,
            projections,
            commands,
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn run(&self, actor: &str, command: Command) -> Executed {
        self.commands
            .execute(&meta(actor), command)
            .unwrap_or_else(|e| panic!("command failed: {e}"))
    }

    pub fn apply_vm(&self, actor: &str, vm: VirtualMachine) -> Executed {
        self.run(
            actor,
            Command::apply(Manifest::VirtualMachine(Box::new(vm))),
        )
    }

    pub fn vm_command(&self, actor: &str, ns: &str, name: &str, command: VmCommand) -> Executed {
        self.run(
            actor,
            Command::Vm {
                namespace: ns.into(),
                name: name.into(),
                command,
            },
        )
    }
}

pub fn meta(actor: &str) -> CommandMeta {
    CommandMeta {
        actor: actor.into(),
        ..CommandMeta::default()
    }
}

/// A small VM with `memory` as its guest memory.
pub fn vm(ns: &str, name: &str, memory: &str) -> VirtualMachine {
    vm_with(ns, name, memory, None)
}

pub fn vm_with(ns: &str, name: &str, memory: &str, firmware_uuid: Option<&str>) -> VirtualMachine {
    let firmware = firmware_uuid
        .map(|u| format!(", firmware: {{uuid: {u}}}"))
        .unwrap_or_default();
    let yaml = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: demo}}}}\nspec:\n  runStrategy: Manual\n  template:\n    spec:\n      domain: {{memory: {{guest: {memory}}}, devices: {{}}{firmware}}}\n"
    );
    match parse_manifest(yaml.as_bytes()).expect("manifest") {
        Manifest::VirtualMachine(vm) => *vm,
        other => panic!("not a VM: {:?}", other.kind()),
    }
}

/// A manifest from shared/testdata/kubevirt.
pub fn testdata(path: &str) -> Manifest {
    let full = testdata_dir::kubevirt_testdata().join(path);
    let bytes = std::fs::read(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()));
    parse_manifest(&bytes).expect("testdata manifest")
}

pub fn put(vm: VirtualMachine) -> Box<PutVm> {
    Box::new(PutVm::new(vm))
}
