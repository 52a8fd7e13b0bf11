//! Paged VMI lists: a VMI list's candidates include VM streams with no VMI, yet no page is
//! empty and the last page says no other follows.

mod common;

use common::{env, vm};
use vmplane_core::VmCommand;
use vmplane_core::types::Kind;

#[test]
fn a_paged_vmi_list_has_no_empty_page_whatever_vms_have_no_vmi() {
    let env = env();
    let running = ["p1", "p5", "p8"];
    for i in 0..10 {
        let name = format!("p{i}");
        env.apply_vm("alice", vm("team-a", &name, "128Mi"));
        if running.contains(&name.as_str()) {
            env.vm_command("alice", "team-a", &name, VmCommand::Start { paused: false });
            env.vm_command(
                "system:reconciler",
                "team-a",
                &name,
                VmCommand::LaunchVmi {
                    features: vmplane_core::Features::defaults(),
                },
            );
        }
    }
    for (limit, expected) in [
        (1, vec![vec!["p1"], vec!["p5"], vec!["p8"]]),
        (2, vec![vec!["p1", "p5"], vec!["p8"]]),
        (3, vec![vec!["p1", "p5", "p8"]]),
        (10, vec![vec!["p1", "p5", "p8"]]),
    ] {
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let mut names = Vec::new();
            let end = env
                .projections
                .visit_page(
                    Kind::VirtualMachineInstance,
                    Some("team-a"),
                    &vmplane_projections::ListPage {
                        after,
                        limit: Some(limit),
                        ..Default::default()
                    },
                    |view| names.push(view.name),
                )
                .expect("page");
            pages.push(names);
            match end.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(pages, expected, "pages of {limit}");
    }
}
