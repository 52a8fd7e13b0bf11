//! Fault injection in projections (`fail`, feature `failpoints`):
//!
//!   cargo test -p vmplane-projections --features failpoints --test failpoints
//!
//! Points: `projections::checkpoint::torn_write` (half a checkpoint reaches the temporary file),
//! `projections::checkpoint::before_rename` (the temporary file is complete and synced, not yet
//! renamed into place), `projections::apply` (catch-up stops before an event, mid-tail).
//! Projections are caches of the log: each test shows the failure is an error to the caller,
//! the previous checkpoint stays the one in place (never a half-written one), and a retry or a
//! restart reaches the digest of a full rebuild.
//!
//! fail's registry is global, so every test holds [`serial`]; this binary holds no other tests.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::{env, vm};
use fail::FailScenario;
use vmplane_core::VmCommand;
use vmplane_projections::checkpoint;

static SERIAL: Mutex<()> = Mutex::new(());

struct Serial {
    _scenario: FailScenario<'static>,
    _guard: MutexGuard<'static, ()>,
}

fn serial() -> Serial {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Serial {
        _scenario: FailScenario::setup(),
        _guard: guard,
    }
}

fn populate(env: &common::Env, prefix: &str, vms: usize) {
    for i in 0..vms {
        let name = format!("{prefix}{i}");
        env.apply_vm("alice", vm("team-a", &name, "128Mi"));
        env.apply_vm("bob", vm("team-a", &name, "256Mi"));
        if i % 2 == 0 {
            env.vm_command("bob", "team-a", &name, VmCommand::Start { paused: false });
        }
    }
}

/// A checkpoint write failing at `point` leaves the previous checkpoint in place; a restart
/// uses it plus the tail; a retried checkpoint succeeds; every digest equals a rebuild's.
fn checkpoint_fails_at(point: &str) {
    let env = env();
    populate(&env, "a", 4);
    env.projections.checkpoint().expect("first checkpoint");
    let path = checkpoint::path(env.data_dir(), "readmodel");
    let first = std::fs::read(&path).expect("checkpoint file");
    let at_first = env.projections.position();
    populate(&env, "b", 3);
    let digest = env.projections.digest().expect("digest");

    fail::cfg(point, "return").expect("configure");
    let err = env
        .projections
        .checkpoint()
        .expect_err("the failure reaches the caller");
    fail::remove(point);
    assert_eq!(
        std::fs::read(&path).expect("checkpoint file"),
        first,
        "{point}: the checkpoint in place changed ({err})"
    );
    assert!(path.with_extension("ckpt.tmp").exists(), "{point}: no temp");

    // Restart: the old checkpoint plus the tail, never the half-written file.
    let env = env.restart();
    assert!(env.projections.position() > at_first);
    assert_eq!(env.projections.digest().expect("digest"), digest);

    // Retry: the checkpoint is written, and a restart from it reaches the same digest.
    env.projections.checkpoint().expect("retried checkpoint");
    assert_ne!(std::fs::read(&path).expect("checkpoint"), first);
    assert!(!path.with_extension("ckpt.tmp").exists());
    let head = env.projections.position();
    let env = env.restart();
    assert_eq!(
        env.projections.position(),
        head,
        "loaded the new checkpoint"
    );
    assert_eq!(env.projections.digest().expect("digest"), digest);
    env.projections.rebuild().expect("rebuild");
    assert_eq!(env.projections.digest().expect("digest"), digest);
}

#[test]
fn a_torn_checkpoint_write_is_an_error_and_never_replaces_the_checkpoint() {
    let _serial = serial();
    checkpoint_fails_at("projections::checkpoint::torn_write");
}

#[test]
fn a_failure_before_the_rename_is_an_error_and_keeps_the_previous_checkpoint() {
    let _serial = serial();
    checkpoint_fails_at("projections::checkpoint::before_rename");
}

/// Catch-up failing mid-tail: an error, the read model stops at a prefix of the log (the last
/// event it applied), no checkpoint is written past it, and the next catch-up resumes there
/// and reaches a rebuild's digest; so does a restart.
#[test]
fn a_failed_apply_mid_catch_up_resumes_to_the_rebuild_digest() {
    let _serial = serial();
    let env = env();
    populate(&env, "a", 3);
    env.projections.checkpoint().expect("checkpoint");
    let path = checkpoint::path(env.data_dir(), "readmodel");
    let checkpointed = std::fs::read(&path).expect("checkpoint file");
    let before = env.projections.position();
    // Writes through the command path, without catching the read model up.
    populate(&env, "b", 3);
    let head = env.log.head();
    assert!(head.0 >= before.0 + 4, "a tail of several events");

    fail::cfg("projections::apply", "2*off->return").expect("configure");
    let err = env
        .projections
        .catch_up()
        .expect_err("the failure reaches the caller");
    fail::remove("projections::apply");
    let stopped = env.projections.position();
    assert_eq!(
        stopped.0,
        before.0 + 2,
        "applied exactly the events before it ({err})"
    );
    assert_eq!(std::fs::read(&path).expect("checkpoint"), checkpointed);

    // Retry: resumes from where it stopped.
    assert_eq!(env.projections.catch_up().expect("catch up"), head);
    let digest = env.projections.digest().expect("digest");
    env.projections.rebuild().expect("rebuild");
    assert_eq!(env.projections.digest().expect("digest"), digest);

    // Restart with the failure on again: opening fails loudly, then opens once it is gone.
    fail::cfg("projections::apply", "return").expect("configure");
    let log = std::sync::Arc::clone(&env.log);
    let reopened = vmplane_projections::Projections::open(log, env.data_dir(), common::options());
    assert!(reopened.is_err(), "open catches up and reports the failure");
    fail::remove("projections::apply");
    let env = env.restart();
    assert_eq!(env.projections.digest().expect("digest"), digest);
}
