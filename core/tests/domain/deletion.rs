//! Deleting a VM: one whose VMI is active is Terminating (KubeVirt's deletionTimestamp and
//! finalizer) until the reconciler has stopped and removed that VMI, and its deletion is
//! recorded with the removal; a stop ends (and removes) the VMI under every strategy; what a
//! stop or a deletion does to the crash-loop count.

use vmplane_core::event::{self, VmiPhase};
use vmplane_core::firmware::claim_key;
use vmplane_core::lifecycle::{
    DesiredAction, PrintableStatus, desired_action, printable_status, vm_status,
};
use vmplane_core::*;

use crate::support::*;

/// The time of the scenario's clock (`ctx()`): 2023-11-14T22:13:20Z.
const NOW: &str = "2023-11-14T22:13:20Z";

fn with(rs: &str) -> Scenario {
    let mut s = Scenario::new();
    s.create(small_vm("demo", rs));
    s
}

fn running(rs: &str) -> Scenario {
    let mut s = with(rs);
    if rs == "Manual" {
        s.ok(VmCommand::Start { paused: false });
    }
    s.ok(launch());
    s.observe(VmiPhase::Running);
    s
}

fn status(s: &Scenario) -> PrintableStatus {
    printable_status(&s.state(), &Features::defaults(), s.ctx.now_ms())
}

fn action(s: &Scenario) -> DesiredAction {
    desired_action(&s.state(), &Features::defaults(), s.ctx.now_ms())
}

fn vmi_uid(s: &Scenario) -> uuid::Uuid {
    s.state().run.vmi.as_ref().expect("a VMI").uid
}

fn delete() -> VmCommand {
    VmCommand::Delete {
        expected_generation: None,
    }
}

fn removed(s: &Scenario) -> VmCommand {
    VmCommand::ObserveVmi {
        vmi_uid: vmi_uid(s),
        observation: VmiObservation::Removed,
    }
}

fn unschedulable(s: &mut Scenario) {
    let uid = vmi_uid(s);
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Scheduling,
            reason: Some("Unschedulable".into()),
            message: Some("0/1 nodes are available".into()),
        },
    });
}

fn release(uuid: &uuid::Uuid) -> Claim {
    Claim::Release {
        key: claim_key(uuid),
        owner: "vm/default/demo".into(),
    }
}

fn rendered(s: &Scenario) -> Option<serde_json::Value> {
    lifecycle::render(&s.state(), &Features::defaults(), s.ctx.now_ms())
        .map(|vm| serde_json::to_value(vm).expect("json"))
}

#[test]
fn deleting_a_running_vm_is_terminating_until_its_vmi_is_gone_then_deleted_with_the_removal() {
    let mut s = running("Always");
    let uid = vmi_uid(&s);
    let fw = s.state().firmware.expect("firmware").uuid;
    let d = s.ok(delete());
    assert_eq!(types_of(&d), ["VmDeletionRequested"]);
    assert_eq!(d.outcome, Outcome::Deleted);
    assert!(
        d.claims.is_empty(),
        "the VM keeps its firmware UUID while it goes"
    );
    let Some(Event::VmDeletionRequested(e)) = d.events.first() else {
        panic!("{:?}", d.events)
    };
    assert_eq!((e.vmi_uid, e.at_ms), (uid, s.ctx.now_ms()));

    // Still there to read, Terminating, with the time its deletion was asked for.
    let state = s.state();
    assert!(state.exists() && !state.is_live());
    assert_eq!(state.terminating().map(|d| d.vmi_uid), Some(uid));
    assert_eq!(status(&s), PrintableStatus::Terminating);
    assert_eq!(action(&s), DesiredAction::Stop { vmi_uid: uid });
    let vm = rendered(&s).expect("a Terminating VM renders");
    assert_eq!(vm["metadata"]["deletionTimestamp"], NOW);
    assert_eq!(vm["status"]["printableStatus"], "Terminating");
    assert_eq!(vm["status"]["created"], true);
    assert!(
        lifecycle::render_vmi(&state).is_some(),
        "its VMI is still there"
    );

    // A second delete is accepted and changes nothing, later too.
    s.ctx.advance_secs(3);
    check_decide(s.events.clone(), delete(), Then::Unchanged);

    // The reconciler stops the VMI: its final phase, and no crash loop.
    let d = s.observe(VmiPhase::Succeeded);
    assert_eq!(types_of(&d), ["VmiPhaseObserved"]);
    assert_eq!(status(&s), PrintableStatus::Terminating);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: uid });
    assert_eq!(
        rendered(&s).expect("still there")["status"]["created"],
        false
    );

    // Then removes it: the VM's deletion is recorded in the same decision.
    let d = s.ok(removed(&s));
    assert_eq!(types_of(&d), ["VmiRemoved", "VmDeleted"]);
    assert_eq!(d.outcome, Outcome::Deleted);
    assert_eq!(d.claims, [release(&fw)]);
    let state = s.state();
    assert!(!state.exists());
    assert_eq!(state.terminating(), None);
    assert_eq!(rendered(&s), None);
    assert_eq!(action(&s), DesiredAction::Nothing);
    // The name is free again.
    s.create(small_vm("demo", "Halted"));
    assert!(s.state().is_live());
}

#[test]
fn a_vm_without_an_active_vmi_is_deleted_at_once() {
    // Never started.
    let mut s = with("Halted");
    let fw = s.state().firmware.expect("firmware").uuid;
    let d = s.ok(delete());
    assert_eq!(types_of(&d), ["VmDeleted"]);
    assert_eq!(d.claims, [release(&fw)]);
    assert!(!s.state().exists());
    // A Manual VM whose VMI ended on its own (kept until asked): no VMI to wait for.
    let mut s = running("Manual");
    s.observe(VmiPhase::Succeeded);
    assert_eq!(action(&s), DesiredAction::Nothing);
    let d = s.ok(delete());
    assert_eq!(types_of(&d), ["VmDeleted"]);
}

#[test]
fn a_terminating_vm_refuses_every_write_but_delete_and_appends_nothing() {
    let mut s = running("Always");
    s.ok(delete());
    let given = s.events.clone();
    // A create or apply of its name, even of the very manifest it holds: AlreadyExists.
    for apply in [
        apply_cmd(small_vm("demo", "Always")),
        apply_cmd(small_vm("demo", "Halted")),
        VmCommand::Create(Box::new(PutVm::new(small_vm("demo", "Always")))),
    ] {
        let s = check_decide(
            given.clone(),
            apply,
            Then::Rejected(Category::AlreadyExists, codes::BEING_DELETED),
        );
        let r = vm::decide(
            &s.state(),
            &apply_cmd(small_vm("demo", "Always")),
            &mut ctx(),
        )
        .expect_err("refused");
        assert_eq!(r.causes[0].field, "metadata.name");
        assert_eq!(
            r.causes[0].reason,
            format!(
                "virtualmachines.kubevirt.io \"demo\" already exists and is being deleted \
                 (since {NOW}; it goes once its VMI has stopped): wait until it is gone with \
                 `vmplane wait --for=delete vm demo -n default`, then apply again"
            )
        );
    }
    // Any other write: FailedPrecondition, saying what was refused and why.
    for (command, what) in [
        (
            VmCommand::Update(Box::new(PutVm::new(small_vm("demo", "Halted")))),
            "an edit",
        ),
        (VmCommand::Start { paused: false }, "a start request"),
        (VmCommand::Stop, "a stop request"),
        (VmCommand::Restart, "a restart request"),
    ] {
        let s = check_decide(
            given.clone(),
            command.clone(),
            Then::Rejected(Category::FailedPrecondition, codes::BEING_DELETED),
        );
        let r = vm::decide(&s.state(), &command, &mut ctx()).expect_err("refused");
        assert_eq!(
            r.causes[0].reason,
            format!(
                "virtualmachines.kubevirt.io \"demo\" is being deleted (since {NOW}; it goes \
                 once its VMI has stopped): {what} is refused; wait until it is gone with \
                 `vmplane wait --for=delete vm demo -n default`, then create it again"
            )
        );
    }
    // No new VMI for it either.
    check_decide(
        given,
        launch(),
        Then::Rejected(Category::FailedPrecondition, codes::LAUNCH_NOT_WANTED),
    );
}

#[test]
fn a_terminating_vm_keeps_the_uuid_its_vmi_runs_with_until_the_vmi_is_gone() {
    let mut s = running("Always");
    let old = s.state().firmware.expect("firmware").uuid;
    let new: uuid::Uuid = "22222222-2222-4222-8222-222222222222".parse().unwrap();
    let mut edited = small_vm("demo", "Always");
    edited.firmware_mut().uuid = Some(new.to_string());
    s.apply(edited);
    let d = s.ok(delete());
    assert!(d.claims.is_empty());
    s.observe(VmiPhase::Succeeded);
    let d = s.ok(removed(&s));
    // Both released with the deletion: the one the VMI ran with, and the VM's own.
    assert_eq!(d.claims, [release(&old), release(&new)]);
}

#[test]
fn deleting_a_never_scheduled_vm_records_no_phase_it_never_had_and_no_crash_loop() {
    // Audit defect 3: an Unschedulable VMI is removed at once (no `Succeeded` for a VMI that
    // never ran), and the VM's deletion follows its removal.
    let mut s = with("Always");
    s.ok(launch());
    unschedulable(&mut s);
    let uid = vmi_uid(&s);
    assert_eq!(status(&s), PrintableStatus::ErrorUnschedulable);
    assert_eq!(types_of(&s.ok(delete())), ["VmDeletionRequested"]);
    assert_eq!(status(&s), PrintableStatus::Terminating);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: uid });
    let d = s.ok(removed(&s));
    assert_eq!(types_of(&d), ["VmiRemoved", "VmDeleted"]);
    assert!(
        !s.events.iter().any(|e| matches!(
            e,
            Event::VmStartBackoffScheduled(_)
                | Event::VmiPhaseObserved(event::VmiPhaseObserved {
                    phase: VmiPhase::Succeeded | VmiPhase::Failed,
                    ..
                })
        )),
        "{:?}",
        s.events.iter().map(Event::type_name).collect::<Vec<_>>()
    );

    // A stop of such a VMI removes it too (nothing to shut down), Stopping meanwhile.
    let mut s = with("Always");
    s.ok(launch());
    unschedulable(&mut s);
    let uid = vmi_uid(&s);
    s.ok(VmCommand::Stop);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: uid });
    assert_eq!(status(&s), PrintableStatus::Stopping);
    s.ok(removed(&s));
    assert_eq!(action(&s), DesiredAction::Nothing);
    assert_eq!(status(&s), PrintableStatus::Stopped);
}

#[test]
fn a_deleted_vm_s_vmi_that_ends_schedules_no_crash_loop_backoff() {
    // A log from before deletion requests: the VM deleted at once while its VMI was
    // unschedulable. The final phase then observed is no crash: no backoff for a deleted VM.
    let mut s = with("Always");
    s.ok(launch());
    unschedulable(&mut s);
    let uid = vmi_uid(&s);
    let mut given = s.events.clone();
    given.push(Event::VmDeleted(event::VmDeleted {
        uid: s.state().uid.expect("uid"),
    }));
    let old = Scenario::given(given.clone()).state();
    // It replays as it always did: deleted, its VMI to stop, no deletion request.
    assert!(!old.exists());
    assert_eq!(old.terminating(), None);
    assert_eq!(vm_status(&old, &Features::defaults(), 0), None);
    check_decide(
        given,
        VmCommand::ObserveVmi {
            vmi_uid: uid,
            observation: VmiObservation::Phase {
                phase: VmiPhase::Succeeded,
                reason: Some("Stopped".into()),
                message: Some("stopped before its domain was started".into()),
            },
        },
        Then::Events(&["VmiPhaseObserved"]),
    );
}

#[test]
fn backoff_summaries_say_when_in_rfc_3339() {
    let e = Event::VmStartBackoffScheduled(event::VmStartBackoffScheduled {
        consecutive_failures: 1,
        retry_at_ms: 1_795_980_037_904,
    });
    assert_eq!(
        e.summary(),
        "crash loop: 1 failures, retry at 2026-11-29T19:20:37Z"
    );
    // A time chrono cannot show is still said.
    let e = Event::VmStartBackoffScheduled(event::VmStartBackoffScheduled {
        consecutive_failures: 2,
        retry_at_ms: i64::MAX,
    });
    assert_eq!(
        e.summary(),
        format!(
            "crash loop: 2 failures, retry at {} ms since the epoch",
            i64::MAX
        )
    );
}

#[test]
fn stopping_a_manual_vm_removes_its_vmi_as_kubevirt_s_stop_deletes_it() {
    // Audit defect 4: after `stop`, a Manual VM had its Succeeded VMI kept.
    let mut s = running("Manual");
    let uid = vmi_uid(&s);
    s.ok(VmCommand::Stop);
    assert_eq!(action(&s), DesiredAction::Stop { vmi_uid: uid });
    s.observe(VmiPhase::Succeeded);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: uid });
    s.ok(removed(&s));
    assert!(s.state().run.vmi.is_none());
    assert_eq!(action(&s), DesiredAction::Nothing, "Manual: no new VMI");
    assert_eq!(status(&s), PrintableStatus::Stopped);
    assert!(lifecycle::render_vmi(&s.state()).is_none());
    // Started again, it runs again.
    s.ok(VmCommand::Start { paused: false });
    assert_eq!(action(&s), DesiredAction::Launch);
}

#[test]
fn a_stop_that_halts_a_crash_looping_vm_clears_its_start_failure() {
    // Audit defect 5.
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Failed);
    s.ok(removed(&s));
    let failure = |s: &Scenario| {
        vm_status(&s.state(), &Features::defaults(), s.ctx.now_ms())
            .expect("a VM")
            .start_failure
    };
    assert_eq!(status(&s), PrintableStatus::CrashLoopBackOff);
    assert_eq!(failure(&s).map(|f| f.consecutive_fail_count), Some(1));
    s.ok(VmCommand::Stop);
    assert_eq!(failure(&s), None);
    assert_eq!(status(&s), PrintableStatus::Stopped);
    assert_eq!(s.state().run.consecutive_failures, 0);
    assert_eq!(s.state().run.backoff_until_ms, None);
    // A start counts from none: launched at once, no backoff left.
    s.ok(VmCommand::Start { paused: false });
    assert_eq!(action(&s), DesiredAction::Launch);
    // Likewise an edit to Manual ends the loop.
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Failed);
    s.ok(removed(&s));
    s.apply(small_vm("demo", "Manual"));
    assert_eq!(failure(&s), None);
}
