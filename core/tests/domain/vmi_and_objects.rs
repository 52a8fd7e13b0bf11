//! Standalone VMIs and the simple object aggregate.

use vmplane_core::types::{Manifest, parse_manifest};
use vmplane_core::*;

use crate::support::*;

fn fold_objects(events: &[Event]) -> ObjectState {
    events.iter().fold(ObjectState::default(), object::evolve)
}

#[test]
fn objects_are_created_updated_unchanged_and_deleted() {
    let csmall = load("examples/csmall.yaml").remove(0);
    let mut c = ctx();
    let mut events = Vec::new();
    let d = object::decide(
        &fold_objects(&events),
        &ObjectCommand::Apply(Box::new(csmall.clone()), None),
        &mut c,
    )
    .unwrap();
    assert_eq!(
        (d.outcome, types_of(&d)),
        (Outcome::Created, vec!["ObjectCreated"])
    );
    events.extend(d.events);
    let d = object::decide(
        &fold_objects(&events),
        &ObjectCommand::Apply(Box::new(csmall.clone()), None),
        &mut c,
    )
    .unwrap();
    assert_eq!(d.outcome, Outcome::Unchanged);
    let Manifest::Instancetype(mut bigger) = csmall.clone() else {
        panic!()
    };
    bigger.spec.memory.guest = "256Mi".parse().unwrap();
    let r = object::decide(
        &fold_objects(&events),
        &ObjectCommand::Apply(Box::new(Manifest::Instancetype(bigger.clone())), Some(5)),
        &mut c,
    );
    assert_rejected(r, Category::Conflict, codes::GENERATION_CONFLICT);
    let d = object::decide(
        &fold_objects(&events),
        &ObjectCommand::Apply(Box::new(Manifest::Instancetype(bigger)), Some(1)),
        &mut c,
    )
    .unwrap();
    assert_eq!(d.outcome, Outcome::Configured);
    events.extend(d.events);
    let st = fold_objects(&events);
    assert_eq!(st.generation, 2);
    let rendered = st.render().unwrap().to_value();
    assert_eq!(rendered["spec"]["memory"]["guest"], "256Mi");
    assert_eq!(rendered["metadata"]["generation"], 2);
    let d = object::decide(&st, &ObjectCommand::Delete(None), &mut c).unwrap();
    events.extend(d.events);
    assert!(!fold_objects(&events).is_live());
    // Created again under the same name: a new object, generation 1 again.
    let d = object::decide(
        &fold_objects(&events),
        &ObjectCommand::Apply(Box::new(csmall.clone()), None),
        &mut c,
    )
    .unwrap();
    assert_eq!(d.outcome, Outcome::Created);
    events.extend(d.events);
    assert_eq!(fold_objects(&events).generation, 1);
    assert_eq!(
        streams::for_object(
            types::Kind::VirtualMachineClusterInstancetype,
            "default",
            "u1.medium"
        ),
        "clusterinstancetype/u1.medium"
    );
    assert_eq!(
        streams::for_object(types::Kind::KubeVirt, "kubevirt", "kubevirt"),
        "cluster/config"
    );
}

#[test]
fn snapshot_restore_clone_and_kubevirt_are_stored_as_objects() {
    for f in [
        "user-guide-snippets/vmsnapshot-snap-larry.yaml",
        "user-guide-snippets/vmrestore-restore-larry.yaml",
        "user-guide-snippets/vmclone-testclone-filters.yaml",
    ] {
        let m = load(f).remove(0);
        let d = object::decide(
            &ObjectState::default(),
            &ObjectCommand::Create(Box::new(m)),
            &mut ctx(),
        )
        .unwrap();
        assert_eq!(d.outcome, Outcome::Created, "{f}");
    }
    let kv = parse_manifest(b"apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: kubevirt, namespace: kubevirt}\nspec: {configuration: {developerConfiguration: {featureGates: [Snapshot]}}}\n").unwrap();
    assert!(
        object::decide(
            &ObjectState::default(),
            &ObjectCommand::Create(Box::new(kv)),
            &mut ctx()
        )
        .is_ok()
    );
    // Kinds vmplane parses but does not manage are refused clearly.
    let pool = load("examples/vm-pool-cirros.yaml").remove(0);
    let r = object::decide(
        &ObjectState::default(),
        &ObjectCommand::Create(Box::new(pool)),
        &mut ctx(),
    );
    assert_rejected(r, Category::Invalid, codes::UNSUPPORTED_KIND);
}

#[test]
fn standalone_vmi_lifecycle_and_immutability() {
    let Manifest::VirtualMachineInstance(vmi) = load("examples/vmi-masquerade.yaml").remove(0)
    else {
        panic!()
    };
    let mut c = ctx();
    let d = vmplane_core::vmi::decide(
        &VmiState::default(),
        &VmiCommand::Apply(vmi.clone()),
        &mut c,
    )
    .unwrap();
    let mut st = d
        .events
        .iter()
        .fold(VmiState::default(), vmplane_core::vmi::evolve);
    assert_eq!(
        vmplane_core::vmi::decide(&st, &VmiCommand::Apply(vmi.clone()), &mut c)
            .unwrap()
            .outcome,
        Outcome::Unchanged
    );
    let mut changed = vmi.clone();
    changed.spec.termination_grace_period_seconds = Some(99);
    assert_rejected(
        vmplane_core::vmi::decide(&st, &VmiCommand::Apply(changed), &mut c),
        Category::Invalid,
        codes::INVALID_VALUE,
    );
    let d = vmplane_core::vmi::decide(
        &st,
        &VmiCommand::Observe(VmiObservation::Scheduled { node: "n1".into() }),
        &mut c,
    )
    .unwrap();
    st = d.events.iter().fold(st, vmplane_core::vmi::evolve);
    assert_eq!(st.phase, Some(event::VmiPhase::Scheduled));
    let d = vmplane_core::vmi::decide(&st, &VmiCommand::Delete, &mut c).unwrap();
    assert_eq!(d.claims.len(), 1);
}

/// A standalone VMI whose node stopped answering is `Unknown`; once the node answers, what it
/// runs as is observed again (`Running`, or an end), as for a VM's VMI.
#[test]
fn a_standalone_vmi_comes_back_from_unknown() {
    let Manifest::VirtualMachineInstance(vmi) = load("examples/vmi-masquerade.yaml").remove(0)
    else {
        panic!()
    };
    let mut c = ctx();
    let apply = |st: VmiState, command: VmiCommand, c: &mut _| {
        let d = vmplane_core::vmi::decide(&st, &command, c).expect("accepted");
        d.events.iter().fold(st, vmplane_core::vmi::evolve)
    };
    let phase = |phase: event::VmiPhase| {
        VmiCommand::Observe(VmiObservation::Phase {
            phase,
            reason: None,
            message: None,
        })
    };
    let mut st = apply(VmiState::default(), VmiCommand::Apply(vmi), &mut c);
    st = apply(
        st,
        VmiCommand::Observe(VmiObservation::Scheduled { node: "n1".into() }),
        &mut c,
    );
    st = apply(st, phase(event::VmiPhase::Running), &mut c);
    st = apply(
        st,
        VmiCommand::Observe(VmiObservation::Phase {
            phase: event::VmiPhase::Unknown,
            reason: Some("NodeUnreachable".into()),
            message: Some("node n1 has not answered".into()),
        }),
        &mut c,
    );
    assert_eq!(st.phase, Some(event::VmiPhase::Unknown));
    st = apply(st, phase(event::VmiPhase::Running), &mut c);
    assert_eq!(st.phase, Some(event::VmiPhase::Running));
    st = apply(st, phase(event::VmiPhase::Unknown), &mut c);
    st = apply(st, phase(event::VmiPhase::Succeeded), &mut c);
    assert_eq!(st.phase, Some(event::VmiPhase::Succeeded));
}
