//! How much of a written object an apply answers with (`ApplyRequest.view`): the whole object by
//! default, everything but its text in the basic view — the same fields a read gives, on every
//! path an apply takes (a VM decided in memory, a VM whose instancetype is resolved on a
//! blocking thread, another kind, a dry run, an unchanged object); an unknown view is refused
//! with nothing written.

use tonic::Code;
use vmplane_gateway::pb::{self, objects_client::ObjectsClient};
use vmplane_tests::{Cli, repo_root};

use crate::{channel, rt, shared_server};

fn example(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples").join(name)).expect("read example")
}

const INSTANCETYPE: &str = "apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata:
  name: small
spec:
  cpu:
    guest: 1
  memory:
    guest: 128Mi
";

const VM_WITH_INSTANCETYPE: &str = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: sized
spec:
  instancetype:
    kind: VirtualMachineInstancetype
    name: small
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
";

/// Applies `manifest` in `ns` asking for `view`.
async fn apply(
    client: &mut ObjectsClient<tonic::transport::Channel>,
    manifest: &str,
    ns: &str,
    view: pb::ObjectView,
    dry_run: bool,
) -> Result<pb::ApplyResponse, tonic::Status> {
    client
        .apply(pb::ApplyRequest {
            manifest: manifest.to_string(),
            namespace: ns.to_string(),
            dry_run,
            view: view.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The object as a read gives it now.
async fn get(
    client: &mut ObjectsClient<tonic::transport::Channel>,
    kind: &str,
    ns: &str,
    name: &str,
) -> pb::Object {
    client
        .get(pb::GetRequest {
            r#ref: Some(pb::ObjectRef {
                kind: kind.to_string(),
                namespace: ns.to_string(),
                name: name.to_string(),
            }),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner()
        .object
        .expect("an object")
}

/// `answer` is `read` without its text, at the answer's position.
fn basic_of(answer: &pb::ApplyResponse, read: &pb::Object) {
    let object = answer.object.as_ref().expect("an object");
    assert!(object.json.is_empty(), "the basic view carries no text");
    assert!(!read.json.is_empty());
    assert_eq!(
        object,
        &pb::Object {
            json: String::new(),
            ..read.clone()
        }
    );
    assert_eq!(object.resource_version, answer.position);
}

#[test]
fn an_apply_in_the_basic_view_answers_what_a_read_gives_but_the_text() {
    let server = shared_server();
    let ns = "views-basic";
    rt().block_on(async {
        let mut client = ObjectsClient::new(channel(server).await);
        use pb::ObjectView::{Basic, Full, Unspecified};

        // A create, decided in memory: every field but the text.
        let created = apply(&mut client, &example("vm.yaml"), ns, Basic, false)
            .await
            .expect("create");
        assert_eq!(created.outcome, "created");
        let read = get(&mut client, "vm", ns, "demo").await;
        basic_of(&created, &read);
        assert_eq!(read.generation, 1);
        assert!(!read.uid.is_empty());

        // An edit: the new generation and position.
        let edited = apply(&mut client, &example("vm-bigger.yaml"), ns, Basic, false)
            .await
            .expect("edit");
        assert_eq!(edited.outcome, "configured");
        let read = get(&mut client, "vm", ns, "demo").await;
        basic_of(&edited, &read);
        assert_eq!(read.generation, 2);

        // Unchanged: the object as it stands.
        let unchanged = apply(&mut client, &example("vm-bigger.yaml"), ns, Basic, false)
            .await
            .expect("re-apply");
        assert_eq!(unchanged.outcome, "unchanged");
        let object = unchanged.object.as_ref().expect("an object");
        assert_eq!(
            object,
            &pb::Object {
                json: String::new(),
                ..read.clone()
            }
        );

        // The default and the full view carry the text a read gives.
        for view in [Unspecified, Full] {
            let full = apply(&mut client, &example("vm-bigger.yaml"), ns, view, false)
                .await
                .expect("re-apply");
            assert_eq!(full.object.as_ref(), Some(&read), "{view:?}");
        }

        // Another kind, and a VM whose instancetype is resolved on a blocking thread.
        let it = apply(&mut client, INSTANCETYPE, ns, Basic, false)
            .await
            .expect("instancetype");
        basic_of(
            &it,
            &get(&mut client, "VirtualMachineInstancetype", ns, "small").await,
        );
        let sized = apply(&mut client, VM_WITH_INSTANCETYPE, ns, Basic, false)
            .await
            .expect("a VM with an instancetype");
        basic_of(&sized, &get(&mut client, "vm", ns, "sized").await);

        // A dry run: the fields the object would have, no text.
        let dry = apply(
            &mut client,
            &example("vm.yaml").replace("name: demo", "name: dry"),
            ns,
            Basic,
            true,
        )
        .await
        .expect("dry run");
        let object = dry.object.expect("an object");
        assert_eq!(
            (
                object.kind.as_str(),
                object.namespace.as_str(),
                object.name.as_str(),
                object.generation,
                object.json.as_str()
            ),
            ("VirtualMachine", ns, "dry", 1, "")
        );
        assert!(uuid::Uuid::parse_str(&object.uid).is_ok(), "{object:?}");
        // A dry-run update: what the full view answers, but the text.
        let edit = example("vm.yaml").replace("guest: 256Mi", "guest: 512Mi");
        let full = apply(&mut client, &edit, ns, Full, true)
            .await
            .expect("dry-run update, full");
        let basic = apply(&mut client, &edit, ns, Basic, true)
            .await
            .expect("dry-run update, basic");
        assert_eq!(basic.outcome, "configured");
        let full = full.object.expect("an object");
        assert_eq!(
            basic.object.expect("an object"),
            pb::Object {
                json: String::new(),
                ..full
            }
        );
    });
}

#[test]
fn an_unknown_view_is_refused_naming_the_field_and_writes_nothing() {
    let server = shared_server();
    let vmplane = Cli::new(server);
    let ns = "views-unknown";
    rt().block_on(async {
        let mut client = ObjectsClient::new(channel(server).await);
        let status = client
            .apply(pb::ApplyRequest {
                manifest: example("vm.yaml"),
                namespace: ns.to_string(),
                view: 7,
                ..Default::default()
            })
            .await
            .expect_err("an unknown view");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("view: 7 is not an ObjectView"),
            "{}",
            status.message()
        );
    });
    let line = vmplane.fails(&["get", "vm", "demo", "-n", ns]);
    assert!(line.contains("not found"), "{line}");
    let audit: serde_json::Value =
        serde_json::from_str(&vmplane.ok(&["audit", "-n", ns, "-o", "json"])).expect("JSON");
    assert_eq!(audit, serde_json::json!([]), "nothing appended");
}

#[test]
fn the_cli_asks_for_the_text_only_when_it_prints_the_object() {
    let vmplane = Cli::new(shared_server());
    let ns = "views-cli";
    let path = repo_root().join("examples").join("vm.yaml");
    let file = path.to_str().expect("utf-8");
    assert_eq!(
        vmplane.ok(&["apply", "-f", file, "-n", ns]),
        "virtualmachine/demo created\n"
    );
    assert_eq!(
        vmplane.ok(&["apply", "-f", file, "-n", ns, "-o", "name"]),
        "virtualmachine/demo\n"
    );
    let printed: serde_json::Value =
        serde_json::from_str(&vmplane.ok(&["apply", "-f", file, "-n", ns, "-o", "json"]))
            .expect("the object as JSON");
    let read: serde_json::Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]))
            .expect("JSON");
    assert_eq!(printed, read);
    assert_eq!(printed["metadata"]["generation"], 1);
}

#[test]
fn apply_with_output_json_prints_a_list_for_several_objects_and_the_object_for_one() {
    let vmplane = Cli::new(shared_server());
    let ns = "views-apply-list";
    let vm = |name: &str| {
        format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: {name}}}\n\
             spec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain: {{memory: \
             {{guest: 64Mi}}, devices: {{}}}}\n"
        )
    };
    let two = format!("{}---\n{}", vm("a"), vm("b"));
    for format in ["json", "yaml"] {
        let (code, out, err) =
            vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "-o", format], &two);
        assert_eq!(code, 0, "{err}");
        let list: serde_json::Value = serde_yaml::from_str(&out).expect("one document");
        assert_eq!(
            (&list["apiVersion"], &list["kind"]),
            (&"v1".into(), &"List".into())
        );
        let items = list["items"].as_array().expect("items");
        let names: Vec<&str> = items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["a", "b"], "{format}");
        // At the last write: a watch from it continues after both.
        let newest = items
            .iter()
            .map(|o| {
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .expect("resourceVersion")
            })
            .max();
        let at = list["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok());
        assert_eq!(at, newest, "{format}");
    }
    // One object in: the object out, not a list.
    let (code, out, err) =
        vmplane.run_with_stdin(&["apply", "-f", "-", "-n", ns, "-o", "json"], &vm("c"));
    assert_eq!(code, 0, "{err}");
    let one: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(one["kind"], "VirtualMachine");
}

#[test]
fn a_dry_run_answers_with_the_object_as_it_would_be_stored_and_stores_nothing() {
    let vmplane = Cli::new(shared_server());
    let ns = "views-dry-run";
    let path = repo_root().join("examples").join("vm.yaml");
    let vm = path.to_str().expect("utf-8");
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };

    // A create: what vmplane decides is in it (namespace, uid, generation 1, the firmware UUID
    // and serial, a status); nothing is written, so its resourceVersion is "0".
    let created = json(&vmplane.ok(&["apply", "-f", vm, "-n", ns, "--dry-run", "-o", "json"]));
    assert_eq!(created["metadata"]["namespace"], ns, "{created:#}");
    assert_eq!(created["metadata"]["generation"], 1, "{created:#}");
    assert_eq!(created["metadata"]["resourceVersion"], "0", "{created:#}");
    assert!(created["metadata"]["uid"].is_string(), "{created:#}");
    let firmware = &created["spec"]["template"]["spec"]["domain"]["firmware"];
    assert!(
        firmware["uuid"].is_string() && firmware["serial"].is_string(),
        "{created:#}"
    );
    assert_eq!(
        created["status"]["printableStatus"], "Stopped",
        "{created:#}"
    );
    let (code, _, _) = vmplane.run(&["get", "vm", "demo", "-n", ns]);
    assert_ne!(code, 0, "a dry run created the VM");

    // An update: the stored object with the edit, one generation on; the stored one unchanged.
    vmplane.ok(&["apply", "-f", vm, "-n", ns]);
    let stored = json(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"]));
    let bigger = repo_root().join("examples").join("vm-bigger.yaml");
    let edited = json(&vmplane.ok(&[
        "apply",
        "-f",
        bigger.to_str().expect("utf-8"),
        "-n",
        ns,
        "--dry-run",
        "-o",
        "json",
    ]));
    assert_eq!(edited["metadata"]["uid"], stored["metadata"]["uid"]);
    assert_eq!(edited["metadata"]["generation"], 2);
    assert_eq!(
        edited["spec"]["template"]["spec"]["domain"]["cpu"]["cores"], 2,
        "{edited:#}"
    );
    assert_eq!(
        edited["spec"]["template"]["spec"]["domain"]["firmware"],
        stored["spec"]["template"]["spec"]["domain"]["firmware"],
        "the firmware UUID is kept on an edit"
    );
    assert_eq!(
        json(&vmplane.ok(&["get", "vm", "demo", "-n", ns, "-o", "json"])),
        stored,
        "a dry run changed the VM"
    );
}
