//! Shared helpers: test data, the given/when/then scenario, expectations.

use std::path::PathBuf;

use vmplane_core::types::{Instancetype, Manifest, Preference, VirtualMachine, parse_manifests};
use vmplane_core::*;

#[path = "../../../tests/testdata_dir.rs"]
mod testdata_dir;

/// `shared/testdata/kubevirt` (where it is looked for: `tests/testdata_dir.rs`).
pub fn testdata_dir() -> PathBuf {
    testdata_dir::kubevirt_testdata()
}

/// Every YAML file under the test data, sorted.
pub fn testdata_files() -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("testdata dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&testdata_dir(), &mut out);
    out.sort();
    out
}

/// All manifests of a test data file (path relative to the test data dir).
pub fn load(rel: &str) -> Vec<Manifest> {
    let bytes = std::fs::read(testdata_dir().join(rel)).expect(rel);
    parse_manifests(&bytes).expect(rel)
}

/// The one VM in a test data file.
pub fn load_vm(rel: &str) -> VirtualMachine {
    load(rel)
        .into_iter()
        .find_map(|m| match m {
            Manifest::VirtualMachine(v) => Some(*v),
            _ => None,
        })
        .expect("a VirtualMachine")
}

/// A named instancetype from a test data file.
pub fn instancetype(rel: &str, name: &str) -> Instancetype {
    load(rel)
        .into_iter()
        .find_map(|m| match m {
            Manifest::Instancetype(o) if o.metadata.name_str() == name => Some(*o),
            _ => None,
        })
        .expect(name)
}

/// A named preference from a test data file.
pub fn preference(rel: &str, name: &str) -> Preference {
    load(rel)
        .into_iter()
        .find_map(|m| match m {
            Manifest::Preference(o) if o.metadata.name_str() == name => Some(*o),
            _ => None,
        })
        .expect(name)
}

pub const CLUSTER_INSTANCETYPES: &str =
    "common-instancetypes/common-clusterinstancetypes-bundle.yaml";
pub const CLUSTER_PREFERENCES: &str = "common-instancetypes/common-clusterpreferences-bundle.yaml";

/// A VM from YAML text.
pub fn vm_from(yaml: &str) -> VirtualMachine {
    match types::parse_manifest(yaml.as_bytes()).expect("test manifest") {
        Manifest::VirtualMachine(v) => *v,
        other => panic!("not a VM: {:?}", other.kind()),
    }
}

/// A small valid VM named `name` with run strategy `rs`.
pub fn small_vm(name: &str, rs: &str) -> VirtualMachine {
    vm_from(&format!(
        r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  namespace: default
  labels: {{app: demo}}
spec:
  runStrategy: {rs}
  template:
    metadata:
      labels: {{app: demo}}
    spec:
      domain:
        memory: {{guest: 128Mi}}
        devices:
          disks:
          - name: root
            disk: {{bus: virtio}}
      volumes:
      - name: root
        containerDisk: {{image: quay.io/containerdisks/cirros}}
"#
    ))
}

/// A fixed context: 2023-11-14T22:13:20Z, seed 1.
pub fn ctx() -> Ctx {
    Ctx::at_secs(1_700_000_000, 1)
}

/// A given/when/then scenario on one VM stream. Accepted events are appended to `events` as
/// the gateway would, after a round trip through the rkyv registry (so every event emitted in a
/// test also proves it encodes and decodes to itself).
pub struct Scenario {
    pub events: Vec<Event>,
    pub ctx: Ctx,
}

impl Scenario {
    /// An empty stream.
    pub fn new() -> Self {
        Scenario {
            events: Vec::new(),
            ctx: ctx(),
        }
    }

    /// Given these events.
    pub fn given(events: Vec<Event>) -> Self {
        Scenario { events, ctx: ctx() }
    }

    /// The folded state.
    pub fn state(&self) -> VmState {
        vm::fold(&self.events)
    }

    /// When this command: decide, and on acceptance append the events.
    pub fn when(&mut self, command: VmCommand) -> Result<Decision, Rejection> {
        let state = self.state();
        let r = vm::decide(&state, &command, &mut self.ctx);
        if let Ok(d) = &r {
            for e in &d.events {
                let enc = encode(e);
                let back =
                    decode(enc.type_name, enc.version, &enc.bytes).expect("decode what we encoded");
                assert_eq!(&back, e, "event survives the registry");
                self.events.push(back);
            }
            // The state the decision carries is the fold of the stream with its events.
            if d.events.is_empty() {
                assert!(d.vm_after.is_none(), "no events, no state after");
            } else {
                assert_eq!(
                    d.vm_after.as_deref(),
                    Some(&self.state()),
                    "the decision's state after is the fold of its events"
                );
            }
        }
        r
    }

    /// When this command, which must be accepted.
    pub fn ok(&mut self, command: VmCommand) -> Decision {
        match self.when(command) {
            Ok(d) => d,
            Err(r) => panic!("rejected: {r} ({:?})", r.codes()),
        }
    }

    /// Creates `vm`.
    pub fn create(&mut self, vm: VirtualMachine) -> Decision {
        self.ok(VmCommand::Create(Box::new(PutVm::new(vm))))
    }

    /// Applies `vm`.
    pub fn apply(&mut self, vm: VirtualMachine) -> Decision {
        self.ok(VmCommand::Apply(Box::new(PutVm::new(vm))))
    }

    /// Observes the current VMI in `phase`.
    pub fn observe(&mut self, phase: event::VmiPhase) -> Decision {
        let uid = self.state().run.vmi.as_ref().expect("a VMI").uid;
        self.ok(VmCommand::ObserveVmi {
            vmi_uid: uid,
            observation: VmiObservation::Phase {
                phase,
                reason: None,
                message: None,
            },
        })
    }
}

/// The reconciler's launch, with every feature at its default (no cluster configuration).
pub fn launch() -> VmCommand {
    launch_with(Features::defaults())
}

/// The reconciler's launch under these cluster features.
pub fn launch_with(features: Features) -> VmCommand {
    VmCommand::LaunchVmi { features }
}

/// `put` helper: a boxed apply command.
pub fn apply_cmd(vm: VirtualMachine) -> VmCommand {
    VmCommand::Apply(Box::new(PutVm::new(vm)))
}

/// The type names of a decision's events.
pub fn types_of(d: &Decision) -> Vec<&'static str> {
    d.events.iter().map(Event::type_name).collect()
}

/// Then: rejected with `category`, and a cause with `code`.
#[track_caller]
pub fn assert_rejected(
    r: Result<Decision, Rejection>,
    category: Category,
    code: &str,
) -> Rejection {
    match r {
        Ok(d) => panic!("expected rejection {code}, got events {:?}", types_of(&d)),
        Err(rej) => {
            assert_eq!(rej.category, category, "{rej}");
            assert!(
                rej.has_code(code),
                "expected {code} in {:?}: {rej}",
                rej.codes()
            );
            rej
        }
    }
}

/// The single VmCreated of a decision.
pub fn created(d: &Decision) -> &event::VmCreated {
    d.events
        .iter()
        .find_map(|e| match e {
            Event::VmCreated(c) => Some(c),
            _ => None,
        })
        .expect("VmCreated")
}

/// What a command should lead to.
pub enum Then<'a> {
    /// Accepted with these event types, in order.
    Events(&'a [&'a str]),
    /// Accepted, nothing to append.
    Unchanged,
    /// Rejected in this category with a cause of this code.
    Rejected(Category, &'a str),
}

/// Given these events, when this command, then this: the one-shot form of [`Scenario`].
#[track_caller]
pub fn check_decide(given: Vec<Event>, when: VmCommand, then: Then) -> Scenario {
    let mut s = Scenario::given(given);
    let before = s.events.len();
    let r = s.when(when);
    match then {
        Then::Events(types) => {
            let d = r.unwrap_or_else(|e| panic!("rejected: {e}"));
            assert_eq!(types_of(&d), types);
        }
        Then::Unchanged => {
            assert_eq!(
                r.unwrap_or_else(|e| panic!("rejected: {e}")),
                Decision::unchanged()
            );
        }
        Then::Rejected(category, code) => {
            assert_rejected(r, category, code);
            assert_eq!(s.events.len(), before, "a rejected command appends nothing");
        }
    }
    s
}
