//! Authentication and authorization with `--auth`: every RPC × principal × namespace gives the
//! code INTERFACE.md promises, a refused request reveals nothing of the object, `-A` shows a
//! principal only what it may read, and the principal is the actor of what it does.

use std::io::{BufRead, BufReader};
use std::sync::OnceLock;

use serde_json::Value;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use vmplane_gateway::pb::{
    self, admin_client::AdminClient, history_client::HistoryClient,
    lifecycle_client::LifecycleClient, objects_client::ObjectsClient, watch_client::WatchClient,
};
use vmplane_tests::{AuthToken, Cli, Server, vmplane_bin, write_auth_file};

use crate::{channel, rt};

const OPS: &str = "ops-7c4f0e1d9a2b";
const ALICE: &str = "alice-5e8a1b3c7d9f";
const VERA: &str = "vera-2d6f9a0c4e1b";
const NOBODY: &str = "nobody-8b3e5f7a1c0d";

/// The callers of the matrix: a principal (with its token), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// Role admin.
    Ops,
    /// edit team-a, view shared.
    Alice,
    /// view team-a.
    Vera,
    /// A valid token without roles.
    Nobody,
    /// No token at all.
    Anonymous,
    /// A token nobody has.
    WrongToken,
}

const CALLERS: [Caller; 6] = [
    Caller::Ops,
    Caller::Alice,
    Caller::Vera,
    Caller::Nobody,
    Caller::Anonymous,
    Caller::WrongToken,
];

impl Caller {
    fn token(self) -> Option<&'static str> {
        match self {
            Caller::Ops => Some(OPS),
            Caller::Alice => Some(ALICE),
            Caller::Vera => Some(VERA),
            Caller::Nobody => Some(NOBODY),
            Caller::Anonymous => None,
            Caller::WrongToken => Some("not-a-token-anyone-has"),
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Caller::Ops => "ops",
            Caller::Alice => "alice",
            Caller::Vera => "vera",
            Caller::Nobody => "nobody",
            Caller::Anonymous => "anonymous",
            Caller::WrongToken => "wrong",
        }
    }

    fn authenticated(self) -> bool {
        !matches!(self, Caller::Anonymous | Caller::WrongToken)
    }

    /// May read objects of `scope` (INTERFACE.md: view/edit namespaces; cluster-scoped objects
    /// and the cluster config readable by every authenticated principal).
    fn may_read(self, scope: Scope) -> bool {
        match (self, scope) {
            (Caller::Ops, _) => true,
            (c, Scope::Cluster | Scope::Config) => c.authenticated(),
            (Caller::Alice, Scope::Ns(ns)) => ns == "team-a" || ns == "shared",
            (Caller::Vera, Scope::Ns(ns)) => ns == "team-a",
            _ => false,
        }
    }

    /// May change objects of `scope` (cluster-scoped and the cluster config, whatever namespace
    /// it names: admin only).
    fn may_write(self, scope: Scope) -> bool {
        matches!(
            (self, scope),
            (Caller::Ops, _) | (Caller::Alice, Scope::Ns("team-a"))
        )
    }
}

/// Where a request points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Ns(&'static str),
    /// Cluster instancetypes.
    Cluster,
    /// The cluster config (kind KubeVirt), named in namespace team-a, where alice may edit:
    /// still one object for the whole cluster, changed by an admin only.
    Config,
}

const SCOPES: [Scope; 5] = [
    Scope::Ns("team-a"),
    Scope::Ns("shared"),
    Scope::Ns("team-b"),
    Scope::Cluster,
    Scope::Config,
];

/// The namespace the cluster config's requests and manifests name.
const CONFIG_NAMESPACE: &str = "team-a";

/// The RPCs of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Apply,
    DryRun,
    Get,
    GetMissing,
    List,
    ListAll,
    Delete,
    Expand,
    ExpandManifest,
    Stop,
    Start,
    Restart,
    History,
    HistoryMissing,
    Diff,
    Audit,
    AuditAll,
    Watch,
    WatchAll,
    LogInfo,
}

/// In the order they run (per caller and scope: stop, start, restart act on one VM).
const RPCS: [Rpc; 20] = [
    Rpc::Apply,
    Rpc::DryRun,
    Rpc::Get,
    Rpc::GetMissing,
    Rpc::List,
    Rpc::ListAll,
    Rpc::Delete,
    Rpc::Expand,
    Rpc::ExpandManifest,
    Rpc::Stop,
    Rpc::Start,
    Rpc::Restart,
    Rpc::History,
    Rpc::HistoryMissing,
    Rpc::Diff,
    Rpc::Audit,
    Rpc::AuditAll,
    Rpc::Watch,
    Rpc::WatchAll,
    Rpc::LogInfo,
];

enum Access {
    Read,
    Write,
    /// Any authenticated principal (results filtered to what it may read).
    Anyone,
    Admin,
}

impl Rpc {
    fn access(self) -> Access {
        match self {
            Rpc::Apply | Rpc::DryRun | Rpc::Delete | Rpc::Stop | Rpc::Start | Rpc::Restart => {
                Access::Write
            }
            Rpc::ListAll | Rpc::AuditAll | Rpc::WatchAll => Access::Anyone,
            Rpc::LogInfo => Access::Admin,
            _ => Access::Read,
        }
    }

    /// Whether the RPC has a meaning in `scope` (lifecycle, expand, audit and watch are about
    /// namespaces; `-A` and the admin call are asked once).
    fn applies_to(self, scope: Scope) -> bool {
        match self {
            Rpc::ListAll | Rpc::AuditAll | Rpc::WatchAll | Rpc::LogInfo => {
                scope == Scope::Ns("team-a")
            }
            Rpc::Expand
            | Rpc::ExpandManifest
            | Rpc::Stop
            | Rpc::Start
            | Rpc::Restart
            | Rpc::Audit
            | Rpc::Watch => matches!(scope, Scope::Ns(_)),
            // The cluster config's history is its stream's, whatever the name asked.
            Rpc::HistoryMissing => scope != Scope::Config,
            _ => true,
        }
    }

    /// What an authorized call answers, given the objects the setup made.
    fn allowed_codes(self) -> &'static [Code] {
        match self {
            Rpc::GetMissing | Rpc::HistoryMissing => &[Code::NotFound],
            // The VM (runStrategy Manual) was never started: a stop may be refused as "not
            // running", after authorization; the start is accepted; whether the restart finds
            // a running VMI depends on the reconciler's progress.
            Rpc::Stop | Rpc::Restart => &[Code::Ok, Code::FailedPrecondition],
            _ => &[Code::Ok],
        }
    }
}

/// The codes INTERFACE.md allows for `caller` calling `rpc` in `scope`.
fn expected(caller: Caller, rpc: Rpc, scope: Scope) -> &'static [Code] {
    if !caller.authenticated() {
        return &[Code::Unauthenticated];
    }
    let allowed = match rpc.access() {
        Access::Read => caller.may_read(scope),
        Access::Write => caller.may_write(scope),
        Access::Anyone => true,
        Access::Admin => caller == Caller::Ops,
    };
    if allowed {
        rpc.allowed_codes()
    } else {
        &[Code::PermissionDenied]
    }
}

/// Cells where the server does not (yet) do what INTERFACE.md promises: asserted as they are.
/// (None today.)
fn known_deviation(_caller: Caller, _rpc: Rpc) -> Option<&'static [Code]> {
    None
}

/// Adds `authorization: Bearer TOKEN`.
#[derive(Clone)]
struct Bearer(Option<String>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            let value = format!("Bearer {token}").parse().expect("ASCII token");
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

type Svc = InterceptedService<Channel, Bearer>;

struct Clients {
    objects: ObjectsClient<Svc>,
    lifecycle: LifecycleClient<Svc>,
    history: HistoryClient<Svc>,
    watch: WatchClient<Svc>,
    admin: AdminClient<Svc>,
}

impl Clients {
    fn new(channel: Channel, token: Option<&str>) -> Clients {
        let b = Bearer(token.map(str::to_string));
        Clients {
            objects: ObjectsClient::with_interceptor(channel.clone(), b.clone()),
            lifecycle: LifecycleClient::with_interceptor(channel.clone(), b.clone()),
            history: HistoryClient::with_interceptor(channel.clone(), b.clone()),
            watch: WatchClient::with_interceptor(channel.clone(), b.clone()),
            admin: AdminClient::with_interceptor(channel, b),
        }
    }
}

/// ops (admin), alice (edit team-a, view shared) and vera (view team-a).
const STAFF: [AuthToken<'static>; 3] = [
    AuthToken {
        principal: "ops",
        token: OPS,
        roles: &[("admin", &[])],
    },
    AuthToken {
        principal: "alice",
        token: ALICE,
        roles: &[("edit", &["team-a"]), ("view", &["shared"])],
    },
    AuthToken {
        principal: "vera",
        token: VERA,
        roles: &[("view", &["team-a"])],
    },
];

struct AuthServer {
    server: Server,
    auth_file: std::path::PathBuf,
}

/// The module's server, with the four principals; objects set up by the admin.
fn auth_server() -> &'static AuthServer {
    static SERVER: OnceLock<AuthServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let auth_file = vmplane_tests::shared_dir().join("auth.yaml");
        let [ops, alice, vera] = STAFF;
        write_auth_file(
            &auth_file,
            &[
                ops,
                alice,
                vera,
                AuthToken {
                    principal: "nobody",
                    token: NOBODY,
                    roles: &[],
                },
            ],
        );
        let text = std::fs::read_to_string(&auth_file).expect("read auth file");
        for token in [OPS, ALICE, VERA, NOBODY] {
            assert!(!text.contains(token), "tokens are stored as digests only");
        }
        let server = Server::start_shared(&["--auth", auth_file.to_str().expect("utf-8")]);
        let auth = AuthServer { server, auth_file };
        rt().block_on(set_up(&auth.server));
        auth
    })
}

fn vm(name: &str, run_strategy: &str) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"{name}"}},
"spec":{{"runStrategy":"{run_strategy}","template":{{"spec":{{"domain":{{"cpu":{{"cores":1}},
"memory":{{"guest":"128Mi"}},"devices":{{}}}}}}}}}}}}"#
    )
}

fn cluster_instancetype(name: &str, cpus: u32) -> String {
    format!(
        r#"{{"apiVersion":"instancetype.kubevirt.io/v1beta1","kind":"VirtualMachineClusterInstancetype",
"metadata":{{"name":"{name}"}},"spec":{{"cpu":{{"guest":{cpus}}},"memory":{{"guest":"1Gi"}}}}}}"#
    )
}

async fn admin_apply(c: &mut Clients, manifest: String, ns: &str) {
    c.objects
        .apply(pb::ApplyRequest {
            manifest,
            namespace: ns.to_string(),
            ..Default::default()
        })
        .await
        .expect("the admin sets up");
}

/// Objects the matrix acts on, made by the admin: in every namespace a `demo` VM with two
/// revisions, and per caller a VM to stop/start/restart (runStrategy Manual) and one to delete; in the cluster scope
/// an instancetype with two revisions and one per caller to delete.
async fn set_up(server: &Server) {
    let mut c = Clients::new(channel(server).await, Some(OPS));
    admin_apply(&mut c, kubevirt_config(&[]), "").await;
    admin_apply(&mut c, kubevirt_config(&["Sidecar"]), "").await;
    for ns in ["team-a", "shared", "team-b"] {
        admin_apply(&mut c, vm("demo", "Halted"), ns).await;
        admin_apply(&mut c, vm("demo", "Halted").replace("128Mi", "256Mi"), ns).await;
        for caller in CALLERS {
            admin_apply(&mut c, vm(&format!("lc-{}", caller.tag()), "Manual"), ns).await;
            admin_apply(&mut c, vm(&format!("del-{}", caller.tag()), "Halted"), ns).await;
        }
    }
    admin_apply(&mut c, cluster_instancetype("matrix-demo", 1), "").await;
    admin_apply(&mut c, cluster_instancetype("matrix-demo", 2), "").await;
    for caller in CALLERS {
        admin_apply(
            &mut c,
            cluster_instancetype(&format!("del-{}", caller.tag()), 1),
            "",
        )
        .await;
    }
}

/// The cluster config, named in [`CONFIG_NAMESPACE`], with these feature gates on.
fn kubevirt_config(gates: &[&str]) -> String {
    let gates: Vec<String> = gates.iter().map(|g| format!("\"{g}\"")).collect();
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"KubeVirt","metadata":{{"name":"kubevirt",
"namespace":"{CONFIG_NAMESPACE}"}},"spec":{{"configuration":{{"developerConfiguration":{{
"featureGates":[{}]}}}}}}}}"#,
        gates.join(",")
    )
}

fn object_ref(scope: Scope, name: &str) -> pb::ObjectRef {
    match scope {
        Scope::Config => pb::ObjectRef {
            kind: "kubevirt".into(),
            namespace: CONFIG_NAMESPACE.into(),
            name: name.into(),
        },
        Scope::Ns(ns) => pb::ObjectRef {
            kind: "vm".into(),
            namespace: ns.into(),
            name: name.into(),
        },
        Scope::Cluster => pb::ObjectRef {
            kind: "clusterinstancetype".into(),
            namespace: String::new(),
            name: name.into(),
        },
    }
}

fn kind(scope: Scope) -> String {
    object_ref(scope, "").kind
}

fn namespace(scope: Scope) -> String {
    object_ref(scope, "").namespace
}

/// Calls `rpc` as `caller` in `scope`; the code and message it answered.
async fn call(c: &mut Clients, caller: Caller, rpc: Rpc, scope: Scope) -> (Code, String) {
    let tag = caller.tag();
    let result: Result<(), Status> = match rpc {
        Rpc::Apply | Rpc::DryRun => {
            let dry_run = rpc == Rpc::DryRun;
            let name = if dry_run {
                format!("dry-{tag}")
            } else {
                format!("ap-{tag}")
            };
            let manifest = match scope {
                Scope::Ns(_) => vm(&name, "Halted"),
                Scope::Cluster => cluster_instancetype(&name, 1),
                Scope::Config => kubevirt_config(&["Sidecar"]),
            };
            c.objects
                .apply(pb::ApplyRequest {
                    manifest,
                    namespace: namespace(scope),
                    dry_run,
                    ..Default::default()
                })
                .await
                .map(drop)
        }
        Rpc::Get | Rpc::GetMissing => {
            let name = if rpc == Rpc::Get {
                match scope {
                    Scope::Ns(_) => "demo",
                    Scope::Cluster => "matrix-demo",
                    Scope::Config => "kubevirt",
                }
            } else {
                "nothing-here"
            };
            c.objects
                .get(pb::GetRequest {
                    r#ref: Some(object_ref(scope, name)),
                    ..Default::default()
                })
                .await
                .map(drop)
        }
        Rpc::List | Rpc::ListAll => c
            .objects
            .list(pb::ListRequest {
                kind: kind(scope),
                namespace: namespace(scope),
                all_namespaces: rpc == Rpc::ListAll,
                min_position: 0,
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::Delete if scope == Scope::Config => {
            // The one cluster config: an admin's delete is undone at once, so the callers
            // after it find it as the setup left it.
            let deleted = c
                .objects
                .delete(pb::DeleteRequest {
                    r#ref: Some(object_ref(scope, "kubevirt")),
                    ..Default::default()
                })
                .await
                .map(drop);
            if deleted.is_ok() {
                admin_apply(c, kubevirt_config(&["Sidecar"]), "").await;
            }
            deleted
        }
        Rpc::Delete => c
            .objects
            .delete(pb::DeleteRequest {
                r#ref: Some(object_ref(scope, &format!("del-{tag}"))),
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::Expand => c
            .objects
            .expand(pb::ExpandRequest {
                source: Some(pb::expand_request::Source::Ref(object_ref(scope, "demo"))),
                namespace: namespace(scope),
            })
            .await
            .map(drop),
        Rpc::ExpandManifest => c
            .objects
            .expand(pb::ExpandRequest {
                source: Some(pb::expand_request::Source::Manifest(vm(
                    "unsaved", "Halted",
                ))),
                namespace: namespace(scope),
            })
            .await
            .map(drop),
        Rpc::Stop | Rpc::Start | Rpc::Restart => {
            let req = pb::LifecycleRequest {
                namespace: namespace(scope),
                name: format!("lc-{tag}"),
                request_id: String::new(),
            };
            match rpc {
                Rpc::Stop => c.lifecycle.stop(req).await.map(drop),
                Rpc::Start => c.lifecycle.start(req).await.map(drop),
                _ => c.lifecycle.restart(req).await.map(drop),
            }
        }
        Rpc::History | Rpc::HistoryMissing => {
            let name = match (rpc, scope) {
                (Rpc::HistoryMissing, _) => "nothing-here",
                (_, Scope::Ns(_)) => "demo",
                (_, Scope::Cluster) => "matrix-demo",
                (_, Scope::Config) => "kubevirt",
            };
            c.history
                .history(pb::HistoryRequest {
                    r#ref: Some(object_ref(scope, name)),
                    min_position: 0,
                    limit: 0,
                })
                .await
                .map(drop)
        }
        Rpc::Diff => {
            let name = match scope {
                Scope::Ns(_) => "demo",
                Scope::Cluster => "matrix-demo",
                Scope::Config => "kubevirt",
            };
            c.history
                .diff(pb::DiffRequest {
                    r#ref: Some(object_ref(scope, name)),
                    from_revision: 1,
                    to_revision: None,
                })
                .await
                .map(drop)
        }
        Rpc::Audit | Rpc::AuditAll => c
            .history
            .audit(pb::AuditRequest {
                namespace: namespace(scope),
                all_namespaces: rpc == Rpc::AuditAll,
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::Watch | Rpc::WatchAll => c
            .watch
            .watch(pb::WatchRequest {
                kind: String::new(),
                namespace: namespace(scope),
                all_namespaces: rpc == Rpc::WatchAll,
                from_position: None,
            })
            .await
            .map(drop),
        Rpc::LogInfo => c.admin.log_info(pb::LogInfoRequest {}).await.map(drop),
    };
    match result {
        Ok(()) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

#[test]
fn every_rpc_answers_every_principal_in_every_namespace_as_promised() {
    let auth = auth_server();
    let mismatches = rt().block_on(async {
        let channel = channel(&auth.server).await;
        let mut mismatches = Vec::new();
        let mut cells = 0;
        for caller in CALLERS {
            let mut c = Clients::new(channel.clone(), caller.token());
            for scope in SCOPES {
                let mut denied_messages = Vec::new();
                for rpc in RPCS {
                    if !rpc.applies_to(scope) {
                        continue;
                    }
                    cells += 1;
                    let (code, message) = call(&mut c, caller, rpc, scope).await;
                    let want = known_deviation(caller, rpc)
                        .unwrap_or_else(|| expected(caller, rpc, scope));
                    if !want.contains(&code) {
                        mismatches.push(format!(
                            "{caller:?} {rpc:?} {scope:?}: got {code:?} ({message}), want {want:?}"
                        ));
                    }
                    if code == Code::PermissionDenied && matches!(rpc, Rpc::Get | Rpc::GetMissing) {
                        denied_messages.push(message);
                    }
                }
                // A refused request reveals nothing: the same answer whether the object exists.
                if let [existing, missing] = &denied_messages[..] {
                    assert_eq!(existing, missing, "{caller:?} {scope:?}");
                    assert!(!existing.contains("demo"), "{existing}");
                }
            }
        }
        assert!(cells > 250, "only {cells} cells");
        mismatches
    });
    assert!(
        mismatches.is_empty(),
        "{} cells differ from INTERFACE.md:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// Runs the CLI against the auth server as `caller`.
fn cli(caller: Caller) -> Cli {
    let base = Cli::new(&auth_server().server);
    match caller.token() {
        Some(token) => base.with_token(token),
        None => base,
    }
}

#[test]
fn the_cli_reports_refusals_in_one_line_and_reads_the_token_from_the_environment() {
    let line = cli(Caller::Alice).fails(&["get", "vms", "-n", "team-b"]);
    assert!(
        line.starts_with("vmplane: error: permission denied:")
            && line.contains("alice")
            && line.contains("team-b"),
        "{line}"
    );
    let line = cli(Caller::Anonymous).fails(&["get", "vms", "-n", "team-a"]);
    assert!(
        line.contains("unauthenticated")
            && line.contains("--token")
            && line.contains("VMPLANE_TOKEN"),
        "says what to do: {line}"
    );
    // Once.
    assert_eq!(line.matches("--token").count(), 1, "{line}");
    let line = cli(Caller::WrongToken).fails(&["get", "vms", "-n", "team-a"]);
    assert!(
        line.contains("unauthenticated")
            && line.contains("not valid")
            && line.matches("--token").count() == 1,
        "{line}"
    );
    let line = cli(Caller::Vera).fails(&["start", "demo", "-n", "team-a"]);
    assert!(
        line.contains("permission denied"),
        "view does not change: {line}"
    );
    // The manifest's own namespace is the one checked, not the -n flag (the CLI refuses an
    // explicit -n that differs from it; the server checks whatever it is sent).
    let elsewhere = vm("sneaky", "Halted").replace(
        r#""metadata":{"name":"sneaky"}"#,
        r#""metadata":{"name":"sneaky","namespace":"team-b"}"#,
    );
    let (code, _, err) = cli(Caller::Alice).run_with_stdin(&["apply", "-f", "-"], &elsewhere);
    assert_ne!(code, 0);
    let line = vmplane_tests::one_error_line(&err);
    assert!(
        line.contains("permission denied") && line.contains("team-b"),
        "{line}"
    );
    let line = cli(Caller::Alice).fails(&["get", "vm", "no-such-vm", "-n", "team-b"]);
    assert!(
        line.contains("permission denied") && !line.contains("not found"),
        "{line}"
    );

    // VMPLANE_TOKEN and VMPLANE_SERVER stand in for --token and --server.
    let out = std::process::Command::new(vmplane_bin())
        .args(["get", "vms", "-n", "team-a", "-o", "json"])
        .env("VMPLANE_SERVER", &auth_server().server.url)
        .env("VMPLANE_TOKEN", VERA)
        .output()
        .expect("run vmplane");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        list["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i["metadata"]["name"] == "demo")),
        "{list}"
    );
}

#[test]
fn the_principal_is_the_actor_and_sees_only_its_namespaces() {
    let auth = auth_server();
    let alice = cli(Caller::Alice);
    let manifest = vm("by-alice", "Halted");
    let (code, out, err) = alice.run_with_stdin(&["apply", "-f", "-", "-n", "team-a"], &manifest);
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/by-alice created\n"),
        "{err}"
    );
    let history: Value = serde_json::from_str(
        &alice.ok(&["history", "vm", "by-alice", "-n", "team-a", "-o", "json"]),
    )
    .expect("JSON");
    assert_eq!(history[0]["actor"], "alice", "{history}");
    let position = history[0]["position"].as_u64().expect("position");
    let table = alice.ok(&["history", "vm", "by-alice", "-n", "team-a"]);
    assert!(table.contains(" alice "), "{table}");

    // audit -A: alice sees team-a, shared and cluster-scoped objects; never team-b.
    let audit = |caller: Caller, extra: &[&str]| -> Vec<Value> {
        let mut args = vec!["audit", "-A", "-o", "json"];
        args.extend_from_slice(extra);
        let out = cli(caller).ok(&args);
        serde_json::from_str::<Value>(&out)
            .expect("JSON")
            .as_array()
            .expect("a list")
            .clone()
    };
    let namespaces = |entries: &[Value]| -> std::collections::BTreeSet<String> {
        entries
            .iter()
            .map(|e| e["namespace"].as_str().expect("namespace").to_string())
            .collect()
    };
    let all = audit(Caller::Ops, &[]);
    assert!(
        namespaces(&all).contains("team-b"),
        "the admin sees every namespace"
    );
    let seen = namespaces(&audit(Caller::Alice, &[]));
    assert!(
        seen.contains("team-a") && seen.contains("shared"),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .all(|ns| ["team-a", "shared", ""].contains(&ns.as_str())),
        "alice sees only her namespaces: {seen:?}"
    );
    let seen = namespaces(&audit(Caller::Vera, &[]));
    assert!(
        seen.iter().all(|ns| ["team-a", ""].contains(&ns.as_str())),
        "vera sees only team-a: {seen:?}"
    );
    let seen = namespaces(&audit(Caller::Nobody, &[]));
    assert!(
        seen.iter().all(String::is_empty),
        "no roles: only cluster-scoped objects: {seen:?}"
    );
    let by_alice = audit(Caller::Ops, &["--actor", "alice"]);
    assert!(
        by_alice
            .iter()
            .any(|e| e["name"] == "by-alice" && e["position"] == position),
        "audit --actor alice shows what alice did"
    );
    assert!(by_alice.iter().all(|e| e["actor"] == "alice"));
    // Alice's own view of the log is the admin's, filtered to her namespaces.
    let alice_view: Vec<Value> = audit(Caller::Alice, &[])
        .into_iter()
        .filter(|e| e["position"].as_u64() <= Some(position))
        .collect();
    let filtered: Vec<Value> = all
        .into_iter()
        .filter(|e| {
            e["position"].as_u64() <= Some(position)
                && ["team-a", "shared", ""].contains(&e["namespace"].as_str().unwrap_or("?"))
        })
        .collect();
    assert_eq!(alice_view, filtered);

    // watch -A replays what alice may read, up to her own event.
    let mut watch = alice.spawn(&["watch", "-A", "-o", "json", "--from-position", "0"]);
    let stdout = watch.stdout.take().expect("stdout");
    let mut watched = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let ev: Value = serde_json::from_str(&line.expect("read")).expect("JSON line");
        let at = ev["position"].as_u64().expect("position");
        watched.push(ev);
        if at >= position {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let watched_positions: Vec<u64> = watched
        .iter()
        .map(|e| e["position"].as_u64().expect("position"))
        .collect();
    let audited_positions: Vec<u64> = filtered
        .iter()
        .map(|e| e["position"].as_u64().expect("position"))
        .collect();
    assert_eq!(
        watched_positions, audited_positions,
        "watch -A and audit -A show alice the same events"
    );
    let _ = auth;
}

#[test]
fn a_non_loopback_listen_is_allowed_with_auth() {
    if std::net::TcpListener::bind("0.0.0.0:0").is_err() {
        eprintln!("skipped: this machine cannot bind 0.0.0.0");
        return;
    }
    let auth = auth_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_listening(
        &dir.path().join("data"),
        "0.0.0.0:0",
        &["--auth", auth.auth_file.to_str().expect("utf-8")],
    );
    assert!(server.addr.ip().is_unspecified(), "{}", server.addr);
    let ops = Cli::new(&server).with_token(OPS);
    let (code, _, err) = ops.run(&["get", "vms", "-n", "team-a"]);
    assert_eq!(code, 0, "{err}");
    let line = Cli::new(&server).fails(&["get", "vms", "-n", "team-a"]);
    assert!(line.contains("unauthenticated"), "{line}");
}

#[test]
fn a_paged_list_of_all_namespaces_shows_a_reader_only_its_own_not_even_in_its_tokens() {
    let auth = auth_server();
    rt().block_on(async {
        let ch = channel(&auth.server).await;
        let mut ops = Clients::new(ch.clone(), Some(OPS));
        let mut vera = Clients::new(ch, Some(VERA));
        let list = |limit: u32, continue_token: String| pb::ListRequest {
            kind: "vm".into(),
            all_namespaces: true,
            limit,
            continue_token,
            ..Default::default()
        };
        let everything = ops
            .objects
            .list(list(0, String::new()))
            .await
            .expect("admin list")
            .into_inner();
        let others: Vec<&str> = everything
            .items
            .iter()
            .map(|o| o.namespace.as_str())
            .filter(|ns| *ns != "team-a")
            .collect();
        assert!(!others.is_empty(), "objects outside team-a exist to hide");
        let whole = vera
            .objects
            .list(list(0, String::new()))
            .await
            .expect("vera list")
            .into_inner();
        assert!(!whole.items.is_empty());
        assert!(whole.items.iter().all(|o| o.namespace == "team-a"));

        // Pages of one: each holds one of vera's objects, and no token names another
        // namespace (a token carries where the next page starts).
        let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
        let mut paged = Vec::new();
        let mut token = String::new();
        loop {
            let page = vera
                .objects
                .list(list(1, token))
                .await
                .expect("vera page")
                .into_inner();
            assert_eq!(page.read_position, whole.read_position);
            for ns in &others {
                assert!(
                    !page.continue_token.contains(&hex(ns)),
                    "a token names namespace {ns}: {}",
                    page.continue_token
                );
            }
            assert_eq!(
                page.items.len(),
                1,
                "an empty page: {:?}",
                page.continue_token
            );
            paged.extend(page.items);
            if page.continue_token.is_empty() {
                break;
            }
            token = page.continue_token;
        }
        let names = |items: &[pb::Object]| -> Vec<String> {
            items
                .iter()
                .map(|o| format!("{}/{}", o.namespace, o.name))
                .collect()
        };
        assert_eq!(names(&paged), names(&whole.items));
    });
}

#[test]
fn the_feature_list_counts_only_the_vms_a_reader_may_read() {
    let ops = cli(Caller::Ops);
    let manifest = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"feat-hostdev"},
"spec":{"runStrategy":"Halted","template":{"spec":{"domain":{"cpu":{"cores":1},"memory":{"guest":"128Mi"},
"devices":{"hostDevices":[{"name":"gpu","deviceName":"example.com/gpu"}]}}}}}}"#;
    let (code, _, err) = ops.run_with_stdin(&["apply", "-f", "-", "-n", "team-b"], manifest);
    assert_eq!(code, 0, "{err}");
    let used_by = |caller: Caller| -> (u64, usize) {
        let features: Value =
            serde_json::from_str(&cli(caller).ok(&["features", "-o", "json"])).expect("JSON");
        let count = features
            .as_array()
            .expect("a list")
            .iter()
            .find(|f| f["name"] == "HostDevices")
            .and_then(|f| f["usedBy"].as_u64())
            .expect("HostDevices with usedBy");
        let users: Value = serde_json::from_str(&cli(caller).ok(&[
            "features",
            "usage",
            "HostDevices",
            "-o",
            "json",
        ]))
        .expect("JSON");
        (count, users["usedBy"].as_array().map_or(0, Vec::len))
    };
    let (all, listed) = used_by(Caller::Ops);
    assert!(all >= 1 && listed >= 1, "the admin counts the VM in team-b");
    // alice (team-a, shared) and vera (team-a) cannot read team-b: its VM is not counted.
    for caller in [Caller::Alice, Caller::Vera] {
        let (count, listed) = used_by(caller);
        assert_eq!(
            count as usize, listed,
            "{caller:?}: the count is what it may list"
        );
        assert!(
            count < all,
            "{caller:?} counts a VM of team-b: {count} of {all}"
        );
    }
}

/// A server of its own with `--auth`: ops (admin), alice (edit team-a, view shared) and vera
/// (view team-a). For tests that change the cluster config or need a fresh log.
fn own_auth_server(dir: &std::path::Path) -> Server {
    let auth_file = dir.join("auth.yaml");
    write_auth_file(&auth_file, &STAFF);
    Server::start(
        &dir.join("data"),
        &[
            "--hypervisor",
            "none",
            "--auth",
            auth_file.to_str().expect("utf-8"),
        ],
    )
}

fn feature_enabled(cli: &Cli, name: &str) -> bool {
    let features: Value = serde_json::from_str(&cli.ok(&["features", "-o", "json"])).expect("JSON");
    features
        .as_array()
        .and_then(|all| all.iter().find(|f| f["name"] == name))
        .and_then(|f| f["enabled"].as_bool())
        .expect("the feature is listed")
}

fn kubevirt_yaml(namespace: &str, gate: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: {namespace}\nspec:\n  configuration:\n    developerConfiguration:\n      featureGates: [{gate}]\n"
    )
}

#[test]
fn the_cluster_config_is_changed_by_an_admin_only_whatever_namespace_it_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = own_auth_server(dir.path());
    let ops = Cli::new(&server).with_token(OPS);
    let alice = Cli::new(&server).with_token(ALICE);
    let vera = Cli::new(&server).with_token(VERA);

    // alice edits team-a: a KubeVirt manifest naming team-a is still the cluster config.
    let hers = kubevirt_yaml("team-a", "DownwardMetrics");
    for args in [
        &["apply", "-f", "-"][..],
        &["apply", "-f", "-", "--dry-run"],
        &["apply", "-f", "-", "-n", "team-a"],
    ] {
        let (code, out, err) = alice.run_with_stdin(args, &hers);
        assert_ne!(code, 0, "{args:?}: {out}");
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains("permission denied")
                && line.contains("KubeVirt")
                && line.contains("admin role"),
            "{args:?}: {line}"
        );
    }
    assert!(
        !feature_enabled(&alice, "DownwardMetrics"),
        "nothing changed"
    );

    let (code, _, err) =
        ops.run_with_stdin(&["apply", "-f", "-"], &kubevirt_yaml("kubevirt", "Sidecar"));
    assert_eq!(code, 0, "{err}");
    for ns in ["team-a", "kubevirt", "default"] {
        let line = alice.fails(&["delete", "kubevirt", "kubevirt", "-n", ns]);
        assert!(line.contains("permission denied"), "{line}");
    }
    assert!(feature_enabled(&vera, "Sidecar"), "alice deleted nothing");

    // Read by every principal, by name or listed, whatever namespace the request names.
    for (who, cli) in [("alice", &alice), ("vera", &vera), ("ops", &ops)] {
        for ns in ["default", "team-a", "kubevirt", "team-b"] {
            let one: Value = serde_json::from_str(
                &cli.ok(&["get", "kubevirt", "kubevirt", "-n", ns, "-o", "json"]),
            )
            .expect("JSON");
            assert_eq!(one["metadata"]["name"], "kubevirt", "{who} -n {ns}");
            let list: Value =
                serde_json::from_str(&cli.ok(&["get", "kubevirt", "-n", ns, "-o", "json"]))
                    .expect("JSON");
            let names: Vec<&str> = list["items"]
                .as_array()
                .expect("items")
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect();
            assert_eq!(names, ["kubevirt"], "{who} -n {ns}: {list}");
        }
        // Its audit entries are in the cluster scope: no namespace the reader has no role in.
        let audit: Value =
            serde_json::from_str(&cli.ok(&["audit", "-A", "--kind", "KubeVirt", "-o", "json"]))
                .expect("JSON");
        let entries = audit.as_array().expect("a list");
        assert!(!entries.is_empty(), "{who}: {audit}");
        for e in entries {
            assert_eq!(
                (
                    e["namespace"].as_str(),
                    e["name"].as_str(),
                    e["actor"].as_str()
                ),
                (Some(""), Some("kubevirt"), Some("ops")),
                "{who}: {e}"
            );
        }
    }
    ops.ok(&["delete", "kubevirt", "kubevirt", "-n", "team-a"]);
    assert!(
        !feature_enabled(&alice, "Sidecar"),
        "the admin's delete took"
    );
}

fn vm_with_uuid(name: &str, uuid: &str) -> String {
    vm(name, "Halted").replace(
        r#""cpu":{"cores":1}"#,
        &format!(r#""cpu":{{"cores":1}},"firmware":{{"uuid":"{uuid}"}}"#),
    )
}

#[test]
fn a_firmware_uuid_conflict_names_the_holder_only_to_a_reader_of_its_namespace() {
    let _ = auth_server();
    let (hidden, shown) = (
        "5b0e7a43-2f1c-4d8e-9a6b-3c7d1e0f9a21",
        "6c1f8b54-3a2d-4e9f-8b7c-4d8e2f1a0b32",
    );
    let ops = cli(Caller::Ops);
    let apply = |cli: &Cli, ns: &str, manifest: &str| {
        cli.run_with_stdin(&["apply", "-f", "-", "-n", ns], manifest)
    };
    let (code, _, err) = apply(&ops, "team-b", &vm_with_uuid("fw-holder", hidden));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = apply(&ops, "shared", &vm_with_uuid("fw-holder-shared", shown));
    assert_eq!(code, 0, "{err}");

    // alice cannot read team-b: neither the holder's name nor its namespace.
    let (code, _, err) = apply(
        &cli(Caller::Alice),
        "team-a",
        &vm_with_uuid("fw-taker", hidden),
    );
    assert_ne!(code, 0);
    let line = vmplane_tests::one_error_line(&err);
    assert!(
        line.contains("already exists")
            && line.contains("spec.template.spec.domain.firmware.uuid")
            && line.ends_with("is already used by another object"),
        "{line}"
    );
    assert!(
        !line.contains("team-b") && !line.contains("fw-holder"),
        "{line}"
    );
    // She can read shared: named.
    let (code, _, err) = apply(
        &cli(Caller::Alice),
        "team-a",
        &vm_with_uuid("fw-taker", shown),
    );
    assert_ne!(code, 0);
    let line = vmplane_tests::one_error_line(&err);
    assert!(
        line.ends_with("is already used by vm/shared/fw-holder-shared"),
        "{line}"
    );
    // The admin reads everything: named.
    let (code, _, err) = apply(&ops, "team-a", &vm_with_uuid("fw-taker", hidden));
    assert_ne!(code, 0);
    let line = vmplane_tests::one_error_line(&err);
    assert!(
        line.ends_with("is already used by vm/team-b/fw-holder"),
        "{line}"
    );
}

#[test]
fn a_failed_restore_records_no_holder_outside_its_own_namespace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = own_auth_server(dir.path());
    let ops = Cli::new(&server).with_token(OPS);
    let uuid = "7d2a9c65-4b3e-4f0a-9c8d-5e9f3a2b1c43";
    let apply = |cli: &Cli, ns: &str, manifest: &str| {
        let (code, _, err) = cli.run_with_stdin(&["apply", "-f", "-", "-n", ns], manifest);
        assert_eq!(code, 0, "{err}");
    };
    // team-a/v1 with the UUID, snapshotted; then v1 takes another UUID, and the snapshot's
    // goes to secret/h2.
    apply(&ops, "team-a", &vm_with_uuid("v1", uuid));
    ops.ok(&["snapshot", "v1", "snap1", "-n", "team-a"]);
    apply(
        &ops,
        "team-a",
        &vm_with_uuid("v1", "8e3b0d76-5c4f-4a1b-8d9e-6f0a4b3c2d54"),
    );
    apply(&ops, "secret", &vm_with_uuid("h2", uuid));

    // alice restores the snapshot onto v1: its UUID is taken, the restore fails.
    let (_, out, err) = Cli::new(&server).with_token(ALICE).run(&[
        "restore",
        "v1",
        "--snapshot",
        "snap1",
        "--restore-name",
        "r1",
        "-n",
        "team-a",
    ]);
    // What vera (view of team-a) reads of it: the restore and the namespace's audit.
    let vera = Cli::new(&server).with_token(VERA);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let restore = loop {
        let restore = vera.ok(&["get", "restore", "r1", "-n", "team-a", "-o", "json"]);
        if restore.contains("already used") {
            break restore;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restore did not fail on the UUID: {restore}\n{out}{err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let audit = vera.ok(&["audit", "-n", "team-a", "-o", "json"]);
    for (what, text) in [("restore", &restore), ("audit", &audit)] {
        assert!(
            !text.contains("secret") && !text.contains("h2"),
            "{what} names the holder: {text}"
        );
    }
    assert!(
        restore.contains("already used by another object"),
        "{restore}"
    );
}

/// Sends `authorization: VALUE` as it is.
#[derive(Clone)]
struct RawAuthorization(String);

impl Interceptor for RawAuthorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let value = self.0.parse().expect("ASCII header value");
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }
}

#[test]
fn the_bearer_scheme_is_accepted_in_any_case() {
    let auth = auth_server();
    rt().block_on(async {
        let ch = channel(&auth.server).await;
        let list = |value: String| {
            let mut objects = ObjectsClient::with_interceptor(ch.clone(), RawAuthorization(value));
            async move {
                objects
                    .list(pb::ListRequest {
                        kind: "vm".into(),
                        namespace: "team-a".into(),
                        ..Default::default()
                    })
                    .await
                    .map(drop)
                    .map_err(|s| s.code())
            }
        };
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            assert_eq!(list(format!("{scheme} {VERA}")).await, Ok(()), "{scheme}");
        }
        for value in [
            format!("Basic {VERA}"),
            VERA.to_string(),
            format!("Bearer{VERA}"),
        ] {
            assert_eq!(
                list(value.clone()).await,
                Err(Code::Unauthenticated),
                "{value}"
            );
        }
    });
}

#[test]
fn reserved_principals_are_refused_at_startup_naming_the_field() {
    for reserved in ["local", "system:reconciler"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let auth_file = dir.path().join("auth.yaml");
        write_auth_file(
            &auth_file,
            &[
                AuthToken {
                    principal: "ops",
                    token: OPS,
                    roles: &[("admin", &[])],
                },
                AuthToken {
                    principal: reserved,
                    token: ALICE,
                    roles: &[("edit", &["team-a"])],
                },
            ],
        );
        let mut child = std::process::Command::new(vmplane_bin())
            .arg("serve")
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(["--listen", "127.0.0.1:0", "--hypervisor", "none", "--auth"])
            .arg(&auth_file)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn vmplane serve");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("vmplane serve started with principal {reserved:?}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(!status.success(), "{reserved}");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
            .expect("read stderr");
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains("tokens[1].principal") && line.contains("reserved"),
            "{line}"
        );
    }
}

#[test]
fn a_refusal_says_what_to_do_next_and_nothing_of_the_object() {
    let _ = auth_server();
    for (caller, args, next) in [
        (
            Caller::Alice,
            &["get", "vm", "demo", "-n", "team-b"][..],
            "ask an admin for the view or edit role in namespace team-b",
        ),
        (
            Caller::Alice,
            &["get", "vm", "no-such-vm", "-n", "team-b"],
            "ask an admin for the view or edit role in namespace team-b",
        ),
        (
            Caller::Vera,
            &["start", "demo", "-n", "team-a"],
            "ask an admin for the edit role in namespace team-a",
        ),
        (
            Caller::Alice,
            &["delete", "clusterinstancetype", "matrix-demo"],
            "use a token with the admin role",
        ),
        (
            Caller::Alice,
            &["audit", "-n", "team-b"],
            "ask an admin for the view or edit role in namespace team-b",
        ),
    ] {
        let line = cli(caller).fails(args);
        assert!(
            line.contains("permission denied") && line.ends_with(next),
            "{args:?}: {line}"
        );
        assert!(
            !line.contains("demo") && !line.contains("no-such-vm") && !line.contains("not found"),
            "{line}"
        );
    }
}
