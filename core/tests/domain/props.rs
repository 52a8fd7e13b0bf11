//! Property tests: random command sequences through decide/evolve.

use std::collections::HashMap;

use proptest::prelude::*;
use vmplane_core::event::{CreateOrigin, VmiPhase};
use vmplane_core::firmware::claim_key;
use vmplane_core::*;

use crate::support::*;

const UUIDS: [&str; 2] = [
    "11111111-1111-4111-8111-111111111111",
    "22222222-2222-4222-8222-222222222222",
];
const STRATEGIES: [&str; 5] = ["Always", "RerunOnFailure", "Manual", "Halted", "Once"];
const PHASES: [VmiPhase; 7] = [
    VmiPhase::Pending,
    VmiPhase::Scheduling,
    VmiPhase::Scheduled,
    VmiPhase::Running,
    VmiPhase::Succeeded,
    VmiPhase::Failed,
    VmiPhase::Unknown,
];

/// A command built from random numbers (some deliberately invalid).
fn command(state: &VmState, op: u8, a: u8, b: u8) -> VmCommand {
    match op % 10 {
        0 | 1 => {
            let mut vm = small_vm("prop", STRATEGIES[usize::from(a) % STRATEGIES.len()]);
            match b % 6 {
                0 => vm.firmware_mut().uuid = Some(UUIDS[usize::from(a) % 2].into()),
                1 => {
                    vm.vmi_spec_mut().domain.memory_mut().guest =
                        Some(format!("{}Mi", 64 + u32::from(a)).parse().unwrap())
                }
                2 => vm.spec.running = Some(true), // invalid with runStrategy
                3 => vm.firmware_mut().uuid = Some("garbage".into()), // invalid
                _ => {}
            }
            let mut put = PutVm::new(vm);
            if b.is_multiple_of(7) {
                put.origin = CreateOrigin::Import;
            }
            if b.is_multiple_of(5) {
                put.expected_generation = Some(u64::from(a % 4));
            }
            VmCommand::Apply(Box::new(put))
        }
        2 => VmCommand::Delete {
            expected_generation: None,
        },
        3 => VmCommand::Start {
            paused: a.is_multiple_of(2),
        },
        4 => VmCommand::Stop,
        5 => VmCommand::Restart,
        6 => launch(),
        7 | 8 => {
            let uid = state.run.vmi.as_ref().map(|v| v.uid).unwrap_or_default();
            let observation = match b % 4 {
                0 => VmiObservation::Scheduled {
                    node: format!("node-{}", a % 2),
                },
                1 => VmiObservation::Removed,
                _ => VmiObservation::Phase {
                    phase: PHASES[usize::from(a) % PHASES.len()],
                    reason: None,
                    message: None,
                },
            };
            VmCommand::ObserveVmi {
                vmi_uid: uid,
                observation,
            }
        }
        _ => VmCommand::Create(Box::new(PutVm::new(small_vm("prop", "Halted")))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn decide_and_evolve_never_panic_and_keep_their_invariants(
        ops in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), 0i64..400), 1..40)
    ) {
        let mut ctx = Ctx::at_secs(1_700_000_000, 7);
        let mut events: Vec<Event> = Vec::new();
        let mut state = VmState::default();
        let mut claims: HashMap<String, String> = HashMap::new();
        for (op, a, b, secs) in ops {
            ctx.advance_secs(secs);
            let cmd = command(&state, op, a, b);
            let before = state.clone();
            match vm::decide(&state, &cmd, &mut ctx) {
                Err(rejection) => {
                    // A rejection changes nothing and always says why.
                    prop_assert!(!rejection.causes.is_empty());
                    prop_assert_eq!(&state, &before);
                }
                Ok(d) => {
                    prop_assert_eq!(d.events.is_empty(), d.outcome == Outcome::Unchanged);
                    if d.events.is_empty() {
                        prop_assert!(d.claims.is_empty());
                    }
                    for c in &d.claims {
                        match c {
                            Claim::Acquire { key, owner } => { claims.insert(key.clone(), owner.clone()); }
                            Claim::Release { key, .. } => { claims.remove(key); }
                        }
                    }
                    for e in &d.events {
                        let enc = encode(e);
                        prop_assert_eq!(&decode(enc.type_name, enc.version, &enc.bytes).unwrap(), e);
                        state = vm::evolve(state, e);
                        events.push(e.clone());
                    }
                    prop_assert_eq!(state.revision, events.len() as u64);
                }
            }
            // Invariants of the folded state.
            prop_assert_eq!(state.unreadable_events, 0);
            // A VM being deleted (Terminating) still holds its claims: its deletion, recorded
            // with its VMI's removal, releases them.
            if state.exists() {
                let fw = state.firmware.clone().unwrap();
                let spec_uuid = state.vm.as_ref().unwrap().firmware().unwrap().uuid.clone();
                prop_assert_eq!(spec_uuid, Some(fw.uuid.to_string()));
                // The claims held are exactly the live VM's UUID, and the one its current
                // VMI was launched with if an edit changed the VM's since.
                let run_uuid = state
                    .run
                    .vmi
                    .as_ref()
                    .and_then(|v| v.firmware_uuid)
                    .filter(|u| *u != fw.uuid && claims.contains_key(&claim_key(u)));
                prop_assert_eq!(claims.len(), 1 + usize::from(run_uuid.is_some()));
                prop_assert!(claims.contains_key(&claim_key(&fw.uuid)));
                let _ = lifecycle::render(&state, &Features::defaults(), ctx.now_ms()).unwrap();
            } else {
                prop_assert!(claims.is_empty());
            }
            // A VM being deleted waits on a VMI: it goes with that VMI's removal.
            if state.terminating().is_some() {
                prop_assert!(state.run.vmi.is_some());
                prop_assert_eq!(
                    lifecycle::printable_status(&state, &Features::defaults(), ctx.now_ms()),
                    lifecycle::PrintableStatus::Terminating
                );
            }
            let _ = lifecycle::printable_status(&state, &Features::defaults(), ctx.now_ms());
            let _ = lifecycle::conditions(&state, &Features::defaults(), ctx.now_ms());
        }
        // Replaying the log gives the same state.
        prop_assert_eq!(vm::fold(&events), state);
        // And the claims a restore derives from the events alone are the ones decided.
        let mut replay = vmplane_core::firmware::ClaimReplay::default();
        let mut replayed: HashMap<String, String> = HashMap::new();
        for e in &events {
            for c in replay.claims("vm/default/prop", e) {
                match c {
                    Claim::Acquire { key, owner } => { replayed.insert(key, owner); }
                    Claim::Release { key, owner } => {
                        if replayed.get(&key) == Some(&owner) { replayed.remove(&key); }
                    }
                }
            }
        }
        prop_assert_eq!(replayed, claims);
    }

    #[test]
    fn evolve_is_total_on_any_event_sequence(picks in prop::collection::vec(0usize..64, 0..60)) {
        // Events decide can produce, in any order (even ones decide would never emit in that
        // order): evolve never panics.
        let mut s = Scenario::new();
        let _ = s.when(apply_cmd(small_vm("prop", "Always")));
        let _ = s.when(launch());
        let _ = s.when(VmCommand::Stop);
        let _ = s.when(VmCommand::Start { paused: false });
        let _ = s.observe(VmiPhase::Failed);
        let _ = s.when(VmCommand::Delete { expected_generation: None });
        let pool = s.events.clone();
        let seq: Vec<Event> = picks.iter().map(|i| pool[i % pool.len()].clone()).collect();
        let st = vm::fold(&seq);
        let _ = lifecycle::printable_status(&st, &Features::defaults(), 0);
        let _ = lifecycle::desired_action(&st, &Features::defaults(), 0);
    }

    #[test]
    fn quantities_compare_like_their_exact_values(n in 0u64..1_000_000, unit in 0usize..4) {
        let (suffix, factor) = [("", 1u64), ("Ki", 1024), ("Mi", 1024 * 1024), ("k", 1000)][unit];
        let q: Quantity = format!("{n}{suffix}").parse().unwrap();
        prop_assert_eq!(q.units_ceil(), i128::from(n) * i128::from(factor));
        let plain: Quantity = format!("{}", u128::from(n) * u128::from(factor)).parse().unwrap();
        prop_assert_eq!(q, plain);
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = types::parse_manifests(&bytes);
    }
}
