//! Run strategies, start/stop/restart rules, VMI phases, backoff, printableStatus, conditions.

use vmplane_core::event::VmiPhase;
use vmplane_core::lifecycle::{DesiredAction, PrintableStatus, desired_action, printable_status};
use vmplane_core::*;

use crate::support::*;

fn with(rs: &str) -> Scenario {
    let mut s = Scenario::new();
    s.create(small_vm("demo", rs));
    s
}

fn now(s: &Scenario) -> i64 {
    s.ctx.now_ms()
}

fn status(s: &Scenario) -> PrintableStatus {
    printable_status(&s.state(), &Features::defaults(), now(s))
}

fn action(s: &Scenario) -> DesiredAction {
    desired_action(&s.state(), &Features::defaults(), now(s))
}

fn vmi_uid(s: &Scenario) -> uuid::Uuid {
    s.state().run.vmi.as_ref().expect("a VMI").uid
}

fn removed(s: &mut Scenario) {
    let uid = vmi_uid(s);
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Removed,
    });
}

#[track_caller]
fn precondition(r: Result<Decision, Rejection>, code: &str, message: &str) {
    let rej = assert_rejected(r, Category::FailedPrecondition, code);
    assert_eq!(rej.causes[0].reason, message);
}

#[test]
fn always_runs_through_the_phases() {
    let mut s = with("Always");
    assert_eq!(action(&s), DesiredAction::Launch);
    assert_eq!(status(&s), PrintableStatus::Starting);
    s.ok(launch());
    assert_eq!(status(&s), PrintableStatus::Starting);
    let uid = vmi_uid(&s);
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Scheduling,
            reason: None,
            message: None,
        },
    });
    let d = s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Scheduled {
            node: "node-1".into(),
        },
    });
    assert_eq!(types_of(&d), ["VmiScheduled"]);
    assert_eq!(
        s.state().run.vmi.as_ref().unwrap().phase,
        VmiPhase::Scheduled
    );
    assert_eq!(status(&s), PrintableStatus::Starting);
    s.observe(VmiPhase::Running);
    assert_eq!(status(&s), PrintableStatus::Running);
    assert_eq!(action(&s), DesiredAction::Nothing);
    let conds = lifecycle::conditions(&s.state(), &Features::defaults(), now(&s));
    assert!(conds.iter().any(|c| c.kind == "Ready" && c.status));
    let rendered = serde_json::to_value(
        lifecycle::render(&s.state(), &Features::defaults(), now(&s)).unwrap(),
    )
    .unwrap();
    assert_eq!(rendered["status"]["printableStatus"], "Running");
    assert_eq!(rendered["status"]["ready"], true);
    assert_eq!(rendered["status"]["runStrategy"], "Always");
    // KubeVirt's Ready=True condition has no reason and no message: left out, not "".
    assert_eq!(
        rendered["status"]["conditions"][0],
        serde_json::json!({"type": "Ready", "status": "True"})
    );
}

#[test]
fn halted_vm_is_stopped_and_start_switches_it_to_always() {
    let mut s = with("Halted");
    assert_eq!(status(&s), PrintableStatus::Stopped);
    assert_eq!(action(&s), DesiredAction::Nothing);
    let conds = lifecycle::conditions(&s.state(), &Features::defaults(), now(&s));
    assert_eq!(
        (conds[0].kind, conds[0].status, conds[0].reason.as_str()),
        ("Ready", false, "VMINotExists")
    );
    let d = s.ok(VmCommand::Start { paused: false });
    assert_eq!(types_of(&d), ["VmStartRequested"]);
    assert_eq!(
        s.state().run_strategy(),
        Some(lifecycle::RunStrategy::Always)
    );
    assert_eq!(
        s.state().generation,
        2,
        "KubeVirt patches runStrategy: a spec change"
    );
    assert_eq!(action(&s), DesiredAction::Launch);
    precondition(
        s.when(VmCommand::Restart),
        codes::RESTART_NOT_ALLOWED,
        "VM is not running",
    );
}

#[test]
fn start_rules_follow_kubevirt() {
    precondition(
        with("Always").when(VmCommand::Start { paused: false }),
        codes::START_NOT_ALLOWED,
        "Always does not support manual start requests",
    );
    precondition(
        with("Once").when(VmCommand::Start { paused: false }),
        codes::START_NOT_ALLOWED,
        "Once does not support manual start requests",
    );
    let mut s = with("Manual");
    s.ok(VmCommand::Start { paused: false });
    s.ok(launch());
    s.observe(VmiPhase::Running);
    precondition(
        s.when(VmCommand::Start { paused: false }),
        codes::START_NOT_ALLOWED,
        "VM is already running",
    );
    let mut s = with("RerunOnFailure");
    s.ok(VmCommand::Start { paused: false });
    s.ok(launch());
    s.observe(VmiPhase::Running);
    s.observe(VmiPhase::Failed);
    precondition(
        s.when(VmCommand::Start { paused: false }),
        codes::START_NOT_ALLOWED,
        "RerunOnFailure does not support starting VM from failed state",
    );
}

#[test]
fn stop_rules_follow_kubevirt() {
    precondition(
        with("Manual").when(VmCommand::Stop),
        codes::STOP_NOT_ALLOWED,
        "VM is not running",
    );
    precondition(
        with("Halted").when(VmCommand::Stop),
        codes::STOP_NOT_ALLOWED,
        "VM is not running",
    );
    // Always: stop patches the strategy to Halted, and the VMI is stopped.
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    let uid = vmi_uid(&s);
    s.ok(VmCommand::Stop);
    assert_eq!(
        s.state().run_strategy(),
        Some(lifecycle::RunStrategy::Halted)
    );
    assert_eq!(action(&s), DesiredAction::Stop { vmi_uid: uid });
    assert_eq!(status(&s), PrintableStatus::Stopping);
    s.observe(VmiPhase::Succeeded);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: uid });
    assert_eq!(status(&s), PrintableStatus::Stopped);
    removed(&mut s);
    assert_eq!(action(&s), DesiredAction::Nothing);
    assert_eq!(
        s.state().run.consecutive_failures,
        0,
        "a requested stop is not a crash"
    );
}

#[test]
fn restart_rules_follow_kubevirt() {
    precondition(
        with("Halted").when(VmCommand::Restart),
        codes::RESTART_NOT_ALLOWED,
        "Halted does not support manual restart requests",
    );
    precondition(
        with("Once").when(VmCommand::Restart),
        codes::RESTART_NOT_ALLOWED,
        "RunStategy Once does not support manual restart requests",
    );
    let mut s = with("Manual");
    s.ok(VmCommand::Start { paused: false });
    s.ok(launch());
    s.observe(VmiPhase::Running);
    let first = vmi_uid(&s);
    let d = s.ok(VmCommand::Restart);
    assert_eq!(types_of(&d), ["VmRestartRequested"]);
    assert_eq!(action(&s), DesiredAction::Stop { vmi_uid: first });
    s.observe(VmiPhase::Succeeded);
    assert_eq!(action(&s), DesiredAction::Remove { vmi_uid: first });
    removed(&mut s);
    assert_eq!(
        action(&s),
        DesiredAction::Launch,
        "a restart starts again, even under Manual"
    );
    s.ok(launch());
    assert_ne!(vmi_uid(&s), first, "every run is a new VMI");
}

#[test]
fn phases_only_move_forward_and_final_phases_are_sticky() {
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    let uid = vmi_uid(&s);
    let back = VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Scheduled,
            reason: None,
            message: None,
        },
    };
    assert_rejected(
        s.when(back),
        Category::FailedPrecondition,
        codes::STALE_OBSERVATION,
    );
    assert_eq!(
        s.observe(VmiPhase::Running).outcome,
        Outcome::Unchanged,
        "seeing the same again changes nothing"
    );
    s.observe(VmiPhase::Succeeded);
    let again = VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Running,
            reason: None,
            message: None,
        },
    };
    assert_rejected(
        s.when(again),
        Category::FailedPrecondition,
        codes::STALE_OBSERVATION,
    );
    let other = VmCommand::ObserveVmi {
        vmi_uid: uuid::Uuid::nil(),
        observation: VmiObservation::Removed,
    };
    assert_rejected(
        s.when(other),
        Category::FailedPrecondition,
        codes::STALE_OBSERVATION,
    );
}

#[test]
fn launch_is_refused_when_no_vmi_is_wanted() {
    assert_rejected(
        with("Halted").when(launch()),
        Category::FailedPrecondition,
        codes::LAUNCH_NOT_WANTED,
    );
    let mut s = with("Always");
    s.ok(launch());
    assert_rejected(
        s.when(launch()),
        Category::FailedPrecondition,
        codes::LAUNCH_NOT_WANTED,
    );
}

#[test]
fn crash_loop_backoff_is_exponential_with_a_cap() {
    let mut s = with("Always");
    let mut delays = Vec::new();
    for failures in 1..=8u32 {
        s.ok(launch());
        let d = s.observe(VmiPhase::Failed);
        let Some(Event::VmStartBackoffScheduled(b)) = d.events.last() else {
            panic!("{:?}", types_of(&d))
        };
        assert_eq!(b.consecutive_failures, failures);
        let delay = b.retry_at_ms - now(&s);
        delays.push(delay);
        let base = (10_000 * i64::from(failures * failures)).min(300_000);
        assert!(
            delay >= base && delay <= (base + base / 2).min(300_000),
            "failure {failures}: {delay} ms"
        );
        removed(&mut s);
        assert_eq!(
            action(&s),
            DesiredAction::WaitBackoff {
                until_ms: b.retry_at_ms
            }
        );
        assert_eq!(status(&s), PrintableStatus::CrashLoopBackOff);
        assert!(
            lifecycle::conditions(&s.state(), &Features::defaults(), now(&s))
                .iter()
                .any(|c| c.kind == "Failure" && c.reason == "CrashLoopBackOff")
        );
        assert_rejected(
            s.when(launch()),
            Category::FailedPrecondition,
            codes::LAUNCH_NOT_WANTED,
        );
        s.ctx.advance_secs(delay / 1000 + 1);
        assert_eq!(action(&s), DesiredAction::Launch);
    }
    assert_eq!(*delays.last().unwrap(), 300_000, "capped at 300 s");
    // Reaching Running clears the count.
    s.ok(launch());
    s.observe(VmiPhase::Running);
    assert_eq!(s.state().run.consecutive_failures, 0);
    assert_eq!(s.state().run.backoff_until_ms, None);
}

#[test]
fn rerun_on_failure_restarts_failed_but_not_succeeded_vmis() {
    let mut s = with("RerunOnFailure");
    // KubeVirt starts it: its last seen strategy (none) differs.
    assert_eq!(action(&s), DesiredAction::Launch, "a new VM starts");
    assert_eq!(status(&s), PrintableStatus::Starting);
    s.ok(launch());
    s.observe(VmiPhase::Running);
    s.observe(VmiPhase::Failed);
    removed(&mut s);
    assert_eq!(action(&s), DesiredAction::Launch, "failed: run again");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    s.observe(VmiPhase::Succeeded);
    removed(&mut s);
    assert_eq!(action(&s), DesiredAction::Nothing, "succeeded: stays down");
    assert_eq!(status(&s), PrintableStatus::Stopped);
}

#[test]
fn switching_to_rerun_on_failure_starts_a_vm_without_a_vmi_but_not_one_with_a_vmi() {
    let mut s = with("Halted");
    assert_eq!(action(&s), DesiredAction::Nothing);
    s.apply(small_vm("demo", "RerunOnFailure"));
    assert_eq!(action(&s), DesiredAction::Launch, "switched: starts");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    // Switching away and back while the VMI exists starts nothing more; once it succeeded it
    // stays down.
    s.apply(small_vm("demo", "Manual"));
    s.apply(small_vm("demo", "RerunOnFailure"));
    s.observe(VmiPhase::Succeeded);
    removed(&mut s);
    assert_eq!(action(&s), DesiredAction::Nothing, "succeeded: stays down");
    // An edit that keeps the strategy starts nothing either.
    let mut edited = small_vm("demo", "RerunOnFailure");
    edited.metadata.annotations = Some(
        [("a".to_owned(), serde_json::json!("b"))]
            .into_iter()
            .collect(),
    );
    s.apply(edited);
    assert_eq!(action(&s), DesiredAction::Nothing);
}

#[test]
fn the_observed_generation_follows_edits_that_leave_the_running_spec_alone_and_never_goes_back() {
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    let observed = |s: &Scenario| s.state().run.vmi.as_ref().unwrap().observed_generation;
    assert_eq!(observed(&s), 1);
    // Metadata only: the run stands for generation 2.
    let mut labelled = small_vm("demo", "Always");
    labelled.metadata.annotations = Some(
        [("note".to_owned(), serde_json::json!("x"))]
            .into_iter()
            .collect(),
    );
    s.apply(labelled.clone());
    assert_eq!(s.state().generation, 2);
    assert_eq!(observed(&s), 2);
    // A spec edit is not what runs: it stays at 2, RestartRequired.
    let mut edited = labelled.clone();
    edited
        .spec
        .template
        .as_mut()
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(5);
    s.apply(edited);
    assert_eq!(observed(&s), 2);
    assert!(lifecycle::restart_required(&s.state()));
    // Reverted: the run is current again at generation 4.
    s.apply(labelled);
    assert_eq!(observed(&s), 4);
    assert!(!lifecycle::restart_required(&s.state()));
}

#[test]
fn once_runs_once_and_manual_waits_for_requests() {
    let mut s = with("Once");
    assert_eq!(action(&s), DesiredAction::Launch);
    s.ok(launch());
    s.observe(VmiPhase::Running);
    s.observe(VmiPhase::Succeeded);
    assert_eq!(action(&s), DesiredAction::Nothing, "never restarted");
    assert_eq!(status(&s), PrintableStatus::Stopped);

    let mut s = with("Manual");
    assert_eq!(action(&s), DesiredAction::Nothing);
    s.ok(VmCommand::Start { paused: true });
    assert_eq!(status(&s), PrintableStatus::Starting, "start expected");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    assert_eq!(status(&s), PrintableStatus::Paused);
    s.observe(VmiPhase::Succeeded);
    assert_eq!(
        action(&s),
        DesiredAction::Nothing,
        "Manual keeps the ended VMI until asked"
    );
}

#[test]
fn deleting_a_running_vm_terminates_its_vmi() {
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    let uid = vmi_uid(&s);
    s.ok(VmCommand::Delete {
        expected_generation: None,
    });
    assert_eq!(status(&s), PrintableStatus::Terminating);
    assert_eq!(action(&s), DesiredAction::Stop { vmi_uid: uid });
    // Still there while its VMI stops (more in `deletion`).
    let vm = lifecycle::render(&s.state(), &Features::defaults(), 0).expect("Terminating");
    assert_eq!(
        vm.status.as_ref().map(|st| st["printableStatus"].clone()),
        Some(serde_json::json!("Terminating"))
    );
}

#[test]
fn unschedulable_vmi_shows_error_unschedulable() {
    let mut s = with("Always");
    s.ok(launch());
    let uid = vmi_uid(&s);
    s.ok(VmCommand::ObserveVmi {
        vmi_uid: uid,
        observation: VmiObservation::Phase {
            phase: VmiPhase::Scheduling,
            reason: Some("Unschedulable".into()),
            message: Some("0/1 nodes are available".into()),
        },
    });
    assert_eq!(status(&s), PrintableStatus::ErrorUnschedulable);
}

#[test]
fn restart_required_is_against_the_spec_of_the_last_start() {
    let mut s = with("Always");
    s.ok(launch());
    s.observe(VmiPhase::Running);
    // Labels are metadata, not template spec.
    let mut vm = small_vm("demo", "Always");
    vm.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("x".into(), "y".into());
    s.apply(vm.clone());
    assert!(!lifecycle::restart_required(&s.state()));
    vm.vmi_spec_mut().termination_grace_period_seconds = Some(30);
    s.apply(vm);
    assert!(lifecycle::restart_required(&s.state()));
    // A restart picks up the new spec and clears it.
    s.ok(VmCommand::Restart);
    s.observe(VmiPhase::Succeeded);
    removed(&mut s);
    s.ok(launch());
    assert!(!lifecycle::restart_required(&s.state()));
}
