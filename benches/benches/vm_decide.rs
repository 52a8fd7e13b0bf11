//! The VM aggregate's decision, alone (no log, no gateway): a create, a re-apply of the same
//! manifest (what GitOps automation sends most: nothing to record) and an edit, each decided
//! on the state the create left. The manifest is the repository's `examples/vm.yaml`, with a
//! namespace, as `vmplane apply` sends it.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vmplane_core::types::{Manifest, VirtualMachine, parse_manifest};
use vmplane_core::{Ctx, PutVm, VmCommand, VmState, vm};

fn example_vm() -> VirtualMachine {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vm.yaml");
    let text = std::fs::read(path).expect("examples/vm.yaml");
    match parse_manifest(&text).expect("examples/vm.yaml parses") {
        Manifest::VirtualMachine(mut vm) => {
            vm.metadata.namespace = Some("default".into());
            *vm
        }
        other => panic!("examples/vm.yaml holds a {:?}", other.kind()),
    }
}

fn apply(vm: VirtualMachine) -> VmCommand {
    VmCommand::Apply(Box::new(PutVm::new(vm)))
}

fn vm_decide(c: &mut Criterion) {
    let mut ctx = Ctx::at_secs(1_700_000_000, 7);
    let manifest = example_vm();
    let create = apply(manifest.clone());
    let created = vm::decide(&VmState::default(), &create, &mut ctx).expect("the create");
    let live = created.events.iter().fold(VmState::default(), vm::evolve);
    assert!(live.is_live());
    let same = apply(manifest.clone());
    let mut bigger = manifest;
    bigger.vmi_spec_mut().domain.memory_mut().guest = Some("512Mi".parse().expect("quantity"));
    let edit = apply(bigger);
    for (command, events) in [(&same, 0), (&edit, 1)] {
        let decided = vm::decide(&live, command, &mut ctx).expect("decided");
        assert_eq!(decided.events.len(), events);
    }

    let mut group = c.benchmark_group("vm_decide");
    group.bench_function("create", |b| {
        b.iter(|| vm::decide(black_box(&VmState::default()), black_box(&create), &mut ctx))
    });
    group.bench_function("reapply_unchanged", |b| {
        b.iter(|| vm::decide(black_box(&live), black_box(&same), &mut ctx))
    });
    group.bench_function("edit", |b| {
        b.iter(|| vm::decide(black_box(&live), black_box(&edit), &mut ctx))
    });
    group.finish();
}

criterion_group!(benches, vm_decide);
criterion_main!(benches);
