//! The state the command path hands back after a write (what the gateway answers `apply` with)
//! is exactly what a read at the write's position gives, and the state it leaves in the cache
//! is what the next command on the stream decides on.

mod common;

use std::sync::Arc;

use common::{env, env_submitting, meta, put, testdata, vm};
use vmplane_core::types::{Kind, parse_manifest};
use vmplane_core::{Outcome, VmCommand};
use vmplane_projections::{AsyncExecuted, At, Command, Executed, Projections, Snapshot};

/// How a test's commands are carried out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// `execute_with_state`, on this thread.
    Blocking,
    /// `execute_async` (the gateway's `apply`): a stream whose state is not in memory is
    /// loaded and the command tried again, once; falling back to `execute_with_state` where
    /// it hands the command back, as the gateway does.
    Submitted,
}

/// Runs `command` along `path`; says whether the async path carried it out itself.
fn execute(
    env: &common::Env,
    path: Path,
    command: Command,
) -> (Executed, Option<Arc<Snapshot>>, bool) {
    if path == Path::Submitted {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let mut command = command;
        let mut loaded = false;
        loop {
            match runtime
                .block_on(env.commands.execute_async(&meta("alice"), command))
                .expect("command")
            {
                AsyncExecuted::Done(done, after) => return (done, after, true),
                AsyncExecuted::Uncached(back) if !loaded => {
                    loaded = true;
                    env.commands
                        .load(&back.stream(), back.kind())
                        .expect("load");
                    command = back;
                }
                AsyncExecuted::Uncached(back) | AsyncExecuted::Blocking(back) => {
                    let (done, after) = env
                        .commands
                        .execute_with_state(&meta("alice"), back)
                        .expect("command");
                    return (done, after, false);
                }
            }
        }
    }
    let (done, after) = env
        .commands
        .execute_with_state(&meta("alice"), command)
        .expect("command");
    (done, after, false)
}

/// Runs `command` along `path` and checks the returned state, rendered, against an ordinary
/// read at the write's position (folded from the log through the stream index). Returns
/// whether the async path carried it out itself.
fn write_and_compare(
    env: &common::Env,
    path: Path,
    kind: Kind,
    ns: &str,
    name: &str,
    command: Command,
) -> bool {
    let (done, after, async_done) = execute(env, path, command);
    let Some(after) = after else {
        assert!(
            done.append.is_none(),
            "an append that wrote events hands back its state"
        );
        return async_done;
    };
    assert_eq!(after.position, done.position);
    assert_eq!(after.state.revision(), done.revision);
    assert_eq!(after.state.generation(), done.generation);
    let written = env
        .projections
        .render_written(&after, kind, ns, name)
        .expect("render the written state");
    // A fresh fold from the log, not the cache the command path just filled.
    let scratch = tempfile::tempdir().expect("temp dir");
    let fresh = Projections::open(
        std::sync::Arc::clone(&env.log),
        scratch.path(),
        common::options(),
    )
    .expect("open a second reader");
    let read = fresh
        .get_at(kind, ns, name, At::Position(done.position))
        .expect("read at the write's position");
    // Compared as text: the answer is byte for byte what a read at its position gives.
    let read = read.map(vmplane_projections::ObjectView::into_json);
    assert_eq!(
        written.as_ref().map(|v| &v.object),
        read.as_ref().map(|v| &v.object),
        "{kind:?} {ns}/{name} at {} ({path:?})",
        done.position
    );
    // The answer rendered from memory alone (the gateway's async answer), where it can be, is
    // the same object.
    if let Some(in_memory) = env.projections.render_written_in_memory(&after, kind) {
        assert_eq!(
            in_memory.as_ref().map(|v| &v.object),
            read.as_ref().map(|v| &v.object),
            "{kind:?} {ns}/{name} at {}, rendered from memory",
            done.position
        );
    }
    async_done
}

#[test]
fn the_state_a_write_hands_back_renders_as_a_read_at_its_position() {
    writes_render_as_reads_at_their_positions(&env(), Path::Blocking);
}

#[test]
fn the_state_a_submitted_write_hands_back_renders_as_a_read_at_its_position() {
    let carried = writes_render_as_reads_at_their_positions(&env_submitting(), Path::Submitted);
    // Creates of new streams and edits of cached states need no read of the log: the async
    // path carries them out itself (the others come back to the blocking path, as checked).
    assert!(carried >= 6, "the async path carried out {carried} writes");
}

/// A sequence of writes along `path`, each compared with a read at its position; returns how
/// many the async path carried out itself.
fn writes_render_as_reads_at_their_positions(env: &common::Env, path: Path) -> usize {
    let mut carried = 0;
    let mut write = |kind, ns: &str, name: &str, command| {
        carried += usize::from(write_and_compare(env, path, kind, ns, name, command));
    };
    let vm_cmd = |name: &str, command: VmCommand| Command::Vm {
        namespace: "team-a".into(),
        name: name.into(),
        command,
    };
    for i in 0..3 {
        let name = format!("vm-{i}");
        let created = vm("team-a", &name, "128Mi");
        write(
            Kind::VirtualMachine,
            "team-a",
            &name,
            vm_cmd(&name, VmCommand::Apply(put(created))),
        );
        write(
            Kind::VirtualMachine,
            "team-a",
            &name,
            vm_cmd(&name, VmCommand::Apply(put(vm("team-a", &name, "256Mi")))),
        );
        write(
            Kind::VirtualMachine,
            "team-a",
            &name,
            vm_cmd(&name, VmCommand::Start { paused: false }),
        );
    }
    // The cluster config with these feature gates on.
    let config = |gates: &str| {
        let yaml = format!(
            "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {{name: kubevirt, namespace: kubevirt}}\nspec:\n  configuration:\n    developerConfiguration:\n      featureGates: [{gates}]\n"
        );
        Command::apply(parse_manifest(yaml.as_bytes()).expect("kubevirt manifest"))
    };
    // A cluster feature change between writes: the answer renders with the config in force.
    env.run("admin", config("Snapshot"));
    write(
        Kind::VirtualMachine,
        "team-a",
        "vm-0",
        vm_cmd("vm-0", VmCommand::Apply(put(vm("team-a", "vm-0", "512Mi")))),
    );
    // A VM asking for a gated feature, written with the gate off, on, and off again: each
    // answer (the in-memory one too) renders with the config in force at its write.
    let gated = |memory: &str| {
        let yaml = format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: vm-dm, namespace: team-a}}\nspec:\n  runStrategy: Always\n  template:\n    spec:\n      domain: {{memory: {{guest: {memory}}}, devices: {{downwardMetrics: {{}}}}}}\n"
        );
        Command::apply(parse_manifest(yaml.as_bytes()).expect("gated VM manifest"))
    };
    let mut blocked = Vec::new();
    for (gates, memory) in [
        ("Snapshot", "128Mi"),
        ("Snapshot, DownwardMetrics", "256Mi"),
        ("Snapshot", "512Mi"),
    ] {
        env.run("admin", config(gates));
        let (_, after, _) = execute(env, path, gated(memory));
        let after = after.expect("a write hands back its state");
        let answer = env
            .projections
            .render_written(&after, Kind::VirtualMachine, "team-a", "vm-dm")
            .expect("render")
            .expect("a live VM");
        blocked.push(answer.object.contains("DownwardMetrics"));
        // Another edit (ten times the memory), compared with a read at its position.
        write(
            Kind::VirtualMachine,
            "team-a",
            "vm-dm",
            gated(&memory.replace("Mi", "0Mi")),
        );
    }
    assert_eq!(
        blocked,
        [true, false, true],
        "the gate's state shows in each answer"
    );
    // A config change after a write, already read by someone else, is not what the write's
    // answer renders with: it renders as of its own position, or not from memory at all.
    let (_, after, _) = execute(env, path, gated("768Mi"));
    let after = after.expect("a write hands back its state");
    env.run("admin", config("Snapshot, DownwardMetrics"));
    env.projections.catch_up().expect("catch up");
    env.projections.features_at(None).expect("features now");
    if let Some(answer) = env
        .projections
        .render_written_in_memory(&after, Kind::VirtualMachine)
    {
        let answer = answer.expect("a live VM");
        assert!(
            answer.object.contains("DownwardMetrics"),
            "rendered with a config written after it: {}",
            answer.object
        );
    }
    // An unchanged apply appends nothing and hands back the state it was decided on (the
    // stream's, as of its last write, before the config change above), which renders as a
    // read at its position; not the answer of a read now.
    let unchanged = || vm_cmd("vm-1", VmCommand::Apply(put(vm("team-a", "vm-1", "256Mi"))));
    let (done, decided_on, _) = execute(env, path, unchanged());
    assert_eq!(done.outcome, Outcome::Unchanged);
    assert!(done.append.is_none());
    let decided_on = decided_on.expect("an unchanged apply hands back the state it was decided on");
    assert_eq!(decided_on.position, done.position);
    write(Kind::VirtualMachine, "team-a", "vm-1", unchanged());
    // A real KubeVirt manifest, then a delete.
    write(
        Kind::VirtualMachine,
        "default",
        "vm-cirros",
        Command::apply(testdata("examples/vm-cirros.yaml")),
    );
    write(
        Kind::VirtualMachine,
        "team-a",
        "vm-2",
        vm_cmd(
            "vm-2",
            VmCommand::Delete {
                expected_generation: None,
            },
        ),
    );
    carried
}

#[test]
fn a_stream_not_in_memory_is_handed_back_uncached_then_carried_out_once_loaded() {
    let env = env_submitting();
    let name = "demo";
    let cmd = |memory: &str| Command::Vm {
        namespace: "team-a".into(),
        name: name.into(),
        command: VmCommand::Apply(put(vm("team-a", name, memory))),
    };
    env.run("alice", cmd("128Mi"));
    // A restart empties the state cache: the stream's state is only in the log.
    let env = env.restart_submitting();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let back = match runtime
        .block_on(env.commands.execute_async(&meta("alice"), cmd("256Mi")))
        .expect("command")
    {
        AsyncExecuted::Uncached(back) => back,
        other => panic!("expected Uncached, got {other:?}"),
    };
    // Handed back untouched: nothing was appended.
    let stream = back.stream();
    assert_eq!(env.log.stream_revision(&stream).expect("revision"), Some(1));
    env.commands.load(&stream, back.kind()).expect("load");
    let (done, after) = match runtime
        .block_on(env.commands.execute_async(&meta("alice"), back))
        .expect("command")
    {
        AsyncExecuted::Done(done, after) => (done, after),
        other => panic!("expected Done once loaded, got {other:?}"),
    };
    assert_eq!(done.outcome, Outcome::Configured);
    assert_eq!(done.generation, 2);
    assert_eq!(
        after.expect("the state after the write").state.revision(),
        env.log
            .stream_revision(&stream)
            .expect("revision")
            .expect("a stream")
    );
}

#[test]
fn the_next_command_decides_on_the_state_the_write_left_in_the_cache() {
    let env = env();
    let name = "demo";
    let cmd = |command: VmCommand| Command::Vm {
        namespace: "team-a".into(),
        name: name.into(),
        command,
    };
    env.run(
        "alice",
        cmd(VmCommand::Apply(put(vm("team-a", name, "128Mi")))),
    );
    for memory in ["256Mi", "512Mi", "256Mi", "1Gi"] {
        let done = env.run(
            "alice",
            cmd(VmCommand::Apply(put(vm("team-a", name, memory)))),
        );
        assert_eq!(done.outcome, Outcome::Configured, "memory {memory}");
    }
    // The same spec again is unchanged: the cached state is the last write's.
    let again = env.run(
        "alice",
        cmd(VmCommand::Apply(put(vm("team-a", name, "1Gi")))),
    );
    assert_eq!(again.outcome, Outcome::Unchanged);
    assert_eq!(again.generation, 5);
    // And it is what a fold from the log after a restart decides on too.
    let env = env.restart();
    let after_restart = env.run(
        "alice",
        cmd(VmCommand::Apply(put(vm("team-a", name, "1Gi")))),
    );
    assert_eq!(after_restart.outcome, Outcome::Unchanged);
    assert_eq!(after_restart.generation, 5);
}
