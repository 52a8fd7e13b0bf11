//! The `vmplane` command line, in kubectl's and virtctl's habits. Every command has `--help`
//! with an example. The client commands talk gRPC to a server (`--server`, env
//! `VMPLANE_SERVER`); `serve` is the server itself.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

/// vmplane: a control plane for virtual machines whose event log is the source of truth.
#[derive(Debug, Parser)]
#[command(name = "vmplane", version, propagate_version = true)]
#[command(mut_subcommands(without_client_flags))]
#[command(after_help = "Examples:
  vmplane serve                          # serve ./vmplane-data on 127.0.0.1:50051
  vmplane apply -f examples/vm.yaml      # create or update objects
  vmplane get vms                        # list VMs in namespace `default`
  vmplane start demo && vmplane get vmi demo
  vmplane history vm demo && vmplane diff vm demo --from 1
  vmplane get vm demo --revision 1 -o yaml
  vmplane audit -A
  vmplane --server https://vmplane.example:50051 --ca-cert ca.pem get vms   # over TLS")]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every client command accepts.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// The vmplane server to talk to: a URL (`http://HOST:PORT`, or `https://` for a TLS
    /// server), or a bare `HOST:PORT` as the server's ready line prints it, taken as `http://`
    /// (as `https://` when --ca-cert is given).
    #[arg(
        long,
        global = true,
        env = "VMPLANE_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    /// PEM file of the CA (one or more certificates) to verify an https:// --server against.
    /// Without it an https:// server must present a certificate from a public CA (the webpki
    /// roots built into vmplane). An https:// server is always reached over TLS, never in
    /// plaintext; http:// is plaintext.
    #[arg(long, global = true, value_name = "FILE", env = "VMPLANE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,

    /// Bearer token (when the server runs with --auth).
    #[arg(long, global = true, env = "VMPLANE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Namespace of the objects named on the command line.
    #[arg(short = 'n', long, global = true, default_value = "default")]
    pub namespace: String,

    /// Output format (`wide`: `get`'s table with more columns; `name`: `KIND/NAME` per object,
    /// for get, apply, import, delete, patch, label, annotate, wait, snapshot, restore and
    /// clone).
    #[arg(short = 'o', long, global = true, value_enum)]
    pub output: Option<Output>,

    /// Whether -n/--namespace was given on the command line (not the default): an object of a
    /// file in another namespace is then refused, as kubectl refuses it.
    #[arg(skip)]
    pub namespace_explicit: bool,
}

/// The ids of [`GlobalArgs`]' flags: the client's, which mean nothing to `serve` and
/// `completion`.
const CLIENT_FLAGS: [&str; 5] = ["server", "ca_cert", "token", "namespace", "output"];

/// `serve` and `completion` with the client's global flags hidden from their help (and usage
/// and completions): each gets a hidden flag of the same id, which keeps the global one from
/// being propagated to it. Still accepted, and ignored, as before. Other commands unchanged.
fn without_client_flags(cmd: clap::Command) -> clap::Command {
    if !matches!(cmd.get_name(), "serve" | "completion") {
        return cmd;
    }
    let globals = GlobalArgs::augment_args(clap::Command::new("globals"));
    globals
        .get_arguments()
        .filter(|a| CLIENT_FLAGS.contains(&a.get_id().as_str()))
        .fold(cmd, |cmd, a| cmd.arg(a.clone().global(false).hide(true)))
}

impl Cli {
    /// Parses the process's arguments (see [`Cli::parse_from_args`]).
    pub fn parse_args() -> Result<Cli, clap::Error> {
        Cli::parse_from_args(std::env::args_os())
    }

    /// Parses `args` as clap does, then records whether `-n` was given and refuses what clap
    /// cannot express: a name with `get -A`, `delete -R` without `-f`, and `-o name` for a
    /// command that prints no objects.
    pub fn parse_from_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cmd = Cli::command();
        let mut matches = cmd.try_get_matches_from_mut(args)?;
        // Asked before the values are taken out of `matches`.
        let namespace_explicit =
            matches.value_source("namespace") == Some(ValueSource::CommandLine);
        let subcommand = matches.subcommand_name().map(str::to_owned);
        let etcd_only = matches
            .subcommand_matches("serve")
            .and_then(etcd_flags_without_etcd);
        let mut cli = Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))?;
        cli.global.namespace_explicit = namespace_explicit;
        // What clap cannot express: the refusal, as clap words its own, for the subcommand.
        let refusal = if let Some(message) = etcd_only {
            Some((clap::error::ErrorKind::ArgumentConflict, message))
        } else if cli.global.output == Some(Output::Name) && !cli.command.prints_object_names() {
            let name = subcommand.as_deref().unwrap_or_default();
            Some((
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "-o name prints object names, and `{name}` prints none; use -o table, yaml \
                     or json (-o name is for get, apply, import, delete, patch, label, annotate, \
                     wait, snapshot, restore and clone)"
                ),
            ))
        } else {
            match &cli.command {
                // (clap's `requires` is not enforced for a flag that defaults to false.)
                Command::Delete(delete) if delete.all_namespaces && delete.selector.is_none() => {
                    Some((
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "-A deletes what a selector matches in every namespace: give it with -l \
                         SELECTOR"
                            .into(),
                    ))
                }
                Command::Delete(delete) if delete.recursive && delete.file.is_empty() => Some((
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "-R reads a directory's subdirectories: give the directory with -f DIR".into(),
                )),
                Command::Get(get) if get.name.is_some() && get.all_namespaces => Some((
                    clap::error::ErrorKind::ArgumentConflict,
                    "a resource cannot be retrieved by name across all namespaces; drop -A \
                     (and pass -n NAMESPACE) to get one object, or drop the name to list them"
                        .into(),
                )),
                _ => None,
            }
        };
        if let Some((kind, message)) = refusal {
            cmd.build();
            let sub = cmd
                .find_subcommand_mut(subcommand.as_deref().unwrap_or_default())
                .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidSubcommand))?;
            return Err(sub.error(kind, message));
        }
        Ok(cli)
    }
}

/// `serve`'s flags that configure the etcd backend, as given on the command line (or in the
/// environment) with another backend: refused rather than ignored, since a server started
/// without its `--backend etcd` would serve a private embedded log of its own.
fn etcd_flags_without_etcd(serve: &clap::ArgMatches) -> Option<String> {
    let backend = serve
        .get_one::<Backend>("backend")
        .copied()
        .unwrap_or(Backend::Sled);
    if backend == Backend::Etcd {
        return None;
    }
    let given: Vec<&str> = [
        ("etcd_endpoints", "--etcd-endpoints"),
        ("etcd_prefix", "--etcd-prefix"),
        ("etcd_max_txn_ops", "--etcd-max-txn-ops"),
        ("leader_lease_seconds", "--leader-lease-seconds"),
    ]
    .into_iter()
    .filter(|(id, _)| {
        matches!(
            serve.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    })
    .map(|(_, flag)| flag)
    .collect();
    if given.is_empty() {
        return None;
    }
    Some(format!(
        "{} applies to --backend etcd only (this is --backend {}): add --backend etcd to serve \
         the log on etcd",
        given.join(", "),
        backend.name()
    ))
}

/// Checks that a time flag's value is an RFC 3339 instant, so a bad one is refused naming
/// the flag (clap says which) before anything is sent.
fn rfc3339(value: &str) -> Result<String, String> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|_| value.to_string())
        .map_err(|e| format!("not an RFC 3339 time ({e}); write it as 2026-11-22T14:05:00Z"))
}

/// A label selector, checked before anything is sent: the reason names the requirement.
fn label_selector(value: &str) -> Result<String, String> {
    vmplane_core::selector::LabelSelector::parse(value)
        .map(|_| value.to_string())
        .map_err(|e| e.reason)
}

/// A label key for `-L`: checked as a selector's key is.
fn label_key(value: &str) -> Result<String, String> {
    let value = value.trim();
    vmplane_core::selector::check_label_key(value)
        .map(|()| value.to_owned())
        .map_err(|why| format!("{value:?} is not one label key: {why}"))
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// The table with more columns (`get` of VMs and VMIs: readiness, run strategy,
    /// instancetype and preference, firmware UUID origin, resourceVersion); elsewhere the table.
    Wide,
    /// KubeVirt-shaped YAML.
    Yaml,
    /// KubeVirt-shaped JSON (one object per line for `watch`).
    Json,
    /// `KIND/NAME` per object, a line each, for scripts (`get`, `apply`, `import`, `delete`,
    /// `snapshot`, `restore`, `clone`).
    Name,
}

impl Command {
    /// Whether `-o name` means something for the command: it prints objects (or, as `serve`
    /// and `completion`, ignores the client's flags altogether).
    fn prints_object_names(&self) -> bool {
        matches!(
            self,
            Command::Serve(_)
                | Command::Completion(_)
                | Command::Apply(_)
                | Command::Import(_)
                | Command::Get(_)
                | Command::Delete(_)
                | Command::Patch(_)
                | Command::Label(_)
                | Command::Annotate(_)
                | Command::Wait(_)
                | Command::Snapshot(_)
                | Command::Restore(_)
                | Command::Clone(_)
        )
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the vmplane server: open the log and serve the gRPC API.
    #[command(after_help = "Examples:
  vmplane serve
  vmplane serve --data ./vmplane-data --listen 127.0.0.1:50051
  vmplane serve --listen 127.0.0.1:0   # any free port; the ready line says which
  vmplane serve --listen 0.0.0.0:50051 --auth auth.yaml
  vmplane serve --listen 0.0.0.0:50051 --auth auth.yaml \\
      --tls-cert server.pem --tls-key server-key.pem   # clients: --server https://HOST:50051
  vmplane serve --hypervisor node1=qemu:///system --hypervisor node2=qemu+ssh://host2/system
  vmplane serve --hypervisor none        # no reconciler: the control plane only")]
    Serve(ServeArgs),

    /// Create or update every object of a YAML/JSON file (multi-document), or of every such
    /// file in a directory.
    #[command(
        after_help = "Prints KIND/NAME created|configured|unchanged for each object, in the order applied.
A `List` (what `get -o yaml` prints for several objects) stands for its items. A directory:
its .yaml, .yml and .json files in name order (subdirectories too with -R). -f may be given
several times: all their objects are one input.

The objects are applied ordered by kind, each kind in the input's order: the cluster
configuration (KubeVirt) first, then instancetypes and preferences, then VMs and VMIs, then
snapshots, restores and clones. So a VM may come before its instancetype in a file, or in a
file named before the instancetype's: a VM captures its instancetype's revision when it is
created, and the instancetype is created first. (kubectl applies in the input's order.)

A dry run creates nothing, so a VM whose instancetype or preference only this input creates
cannot be checked against it: its line says `not checked (dry run)` and why, and it is not
counted as refused (with -o name|json|yaml it is said on stderr and not printed). Anything
else the server finds wrong with the VM is refused as usual.

Examples:
  vmplane apply -f vm.yaml
  cat vms.yaml | vmplane apply -f -
  vmplane get vms -o yaml > vms.yaml && vmplane apply -f vms.yaml   # unchanged, each
  vmplane apply -f manifests/                 # every manifest file in manifests/
  vmplane apply -f manifests/ -R              # and in its subdirectories
  vmplane apply -f vm.yaml -f instancetype.yaml   # the instancetype is applied first
  vmplane apply -f vm.yaml --dry-run          # validate server-side, change nothing
  vmplane apply -f vm.yaml --dry-run -o yaml  # the object as it would be stored
  vmplane apply -f vm.yaml --expected-generation 3"
    )]
    Apply(ApplyArgs),

    /// Like apply, for manifests exported from a KubeVirt cluster: a VM without a firmware UUID
    /// keeps the legacy, name-derived UUID KubeVirt gave it.
    #[command(
        after_help = "The objects are applied ordered by kind, as apply orders them (the cluster configuration,
instancetypes and preferences, VMs and VMIs, snapshots, restores, clones), each kind in the
input's order.

Examples:
  vmplane import -f exported-vms.yaml
  vmplane import -f exported/ -R
  vmplane import -f exported-vms.yaml -f exported-instancetypes.yaml"
    )]
    Import(ApplyArgs),

    /// Show one object or a list, now or at a point in its history.
    #[command(
        after_help = "KIND: vm, vmi, instancetype, clusterinstancetype, preference, clusterpreference,
snapshot, restore, clone, kubevirt (kubectl's long and plural forms work too).

Examples:
  vmplane get vms
  vmplane get vms -A -o json
  vmplane get vms -l app=web,tier!=db                  # by labels (kubectl's selectors)
  vmplane get vms -l 'env in (prod,staging)' -o name
  vmplane get vms -L app,env                          # a column per label
  vmplane get vms --show-labels
  vmplane get vm demo -o yaml
  vmplane get vm demo --revision 1 -o yaml           # time travel
  vmplane get vm demo --at-position 120
  vmplane get vms -A --as-of 2026-11-22T14:05:00Z       # every VM as it was then
  vmplane get vm demo --as-of 2026-11-22T10:00:00Z"
    )]
    Get(GetArgs),

    /// Delete an object, the objects a label selector matches, or the objects a file names.
    #[command(
        after_help = "A VM whose VMI runs is Terminating (metadata.deletionTimestamp) until the \
reconciler has shut the guest down and removed the VMI; meanwhile its name cannot be applied \
again. `vmplane wait vm NAME --for delete` returns once it is gone.

Examples:\n  vmplane delete vm demo\n  vmplane delete instancetype small -n team-a\n  \
                      vmplane delete vms -l app=web              # every VM labelled app=web\n  \
                      vmplane delete vms -l app=web -A           # in every namespace\n  \
                      vmplane delete -f examples/vm.yaml          # what apply -f created\n  \
                      vmplane delete -f manifests/ -R --ignore-not-found"
    )]
    Delete(DeleteArgs),

    /// Change one object with a patch: a JSON merge patch (RFC 7386, the default) or a JSON
    /// patch (RFC 6902). The object is read, patched and written back only if nobody wrote it
    /// in between (else read again and patched again), so no other change is lost.
    #[command(
        after_help = "The patch is JSON or YAML. KubeVirt's kinds are custom resources, \
for which kubectl has no strategic merge patch either: merge is the default here.

Examples:
  vmplane patch vm demo -p '{\"spec\":{\"runStrategy\":\"Always\"}}'
  vmplane patch vm demo --type json -p '[{\"op\":\"replace\",\"path\":\"/spec/template/spec/domain/memory/guest\",\"value\":\"1Gi\"}]'
  vmplane patch instancetype small --patch-file bigger.yaml --dry-run"
    )]
    Patch(PatchArgs),

    /// Set (KEY=VALUE) or remove (KEY-) labels of one object.
    #[command(
        after_help = "An existing label keeps its value unless --overwrite is given. \
The change is written only if nobody wrote the object since it was read (else it is read \
again), so no other change is lost.

Examples:
  vmplane label vm demo env=prod tier=web
  vmplane label vm demo env=staging --overwrite
  vmplane label vm demo tier-                    # remove the label"
    )]
    Label(MetadataArgs),

    /// Set (KEY=VALUE) or remove (KEY-) annotations of one object.
    #[command(after_help = "Examples:
  vmplane annotate vm demo owner=team-a
  vmplane annotate vm demo description='the demo VM' --overwrite
  vmplane annotate vm demo owner-")]
    Annotate(MetadataArgs),

    /// Wait until an object meets a condition, has a field's value, is created or is deleted:
    /// for scripts, as kubectl's `wait`. Woken by the object's events, not by polling.
    #[command(
        after_help = "Exits 0 once it holds (printing KIND/NAME condition met), non-zero with \
what was last seen when --timeout passes.

Examples:
  vmplane start demo && vmplane wait vmi demo --for condition=Ready
  vmplane wait vm demo --for jsonpath='{.status.printableStatus}'=Running --timeout 2m
  vmplane wait vm demo --for condition=Ready=false
  vmplane wait snapshot snap1 --for jsonpath='{.status.readyToUse}'=true
  vmplane delete vm demo && vmplane wait vm demo --for delete"
    )]
    Wait(WaitArgs),

    /// Ask for a VM to start.
    #[command(after_help = "Examples:\n  vmplane start demo")]
    Start(LifecycleArgs),
    /// Ask for a VM to stop.
    #[command(after_help = "Examples:\n  vmplane stop demo")]
    Stop(LifecycleArgs),
    /// Ask for a VM to restart.
    #[command(after_help = "Examples:\n  vmplane restart demo")]
    Restart(LifecycleArgs),

    /// Print the fully rendered VM: instancetype, preference, defaults, firmware identity.
    #[command(
        after_help = "Examples:\n  vmplane expand vm demo -o yaml\n  vmplane expand -f vm.yaml"
    )]
    Expand(ExpandArgs),

    /// Show an object for people: who and what it is, its spec and status, and its latest
    /// events from the log (for scripts: `get -o json`, `history -o json`).
    #[command(after_help = "Examples:\n  vmplane describe vm demo\n  \
                      vmplane describe snapshot snap1 -n team-a\n  \
                      vmplane describe vm demo --events 100   # more of its history")]
    Describe(DescribeArgs),

    /// List a VM's revisions: time, actor, events, summary.
    #[command(
        after_help = "A revision counts every event of the VM's stream (start and stop requests
and its VMI's lifecycle too); metadata.generation counts the VM's own changes, as Kubernetes'
does. `-o wide` and `-o json` give each revision's generation; `get --revision` and
`diff` take revisions.

Examples:
  vmplane history vm demo
  vmplane history vm demo -o wide
  vmplane history vm demo -o json"
    )]
    History(HistoryArgs),

    /// Unified diff of a VM's spec between two revisions. Exit 0 when equal, 1 when different.
    #[command(
        after_help = "With -o json or -o yaml: one object instead of the diff, with the same exit status:
  {\"from\": N, \"to\": M, \"equal\": true|false, \"diff\": \"UNIFIED DIFF\"}
`to` is the revision compared to (the current one without --to); `diff` is empty when equal.

Examples:
  vmplane diff vm demo --from 1            # revision 1 against the current one
  vmplane diff vm demo --from 1 --to 3
  vmplane diff vm demo --from 1 -o json | jq -r .diff"
    )]
    Diff(DiffArgs),

    /// Who did what, when.
    #[command(
        after_help = "The entries of one namespace (-n), or of every namespace you may read (-A) and of the
cluster-scoped objects. The cluster configuration (kubevirt), cluster instancetypes and
cluster preferences are in no namespace: `--kind` of one of them shows its entries without -A,
whatever -n says.

Examples:
  vmplane audit                                  # namespace `default`
  vmplane audit -A --actor alice
  vmplane audit --kind kubevirt                  # who changed the cluster configuration
  vmplane audit --kind vm --since 2026-11-22T00:00:00Z --until 2026-11-23T00:00:00Z"
    )]
    Audit(AuditArgs),

    /// Print events as they happen.
    #[command(
        after_help = "With -o json: one JSON object a line. Each event is shown as the kind
it is about, except that `watch vms` also delivers the VMI events of a VM's stream as changes
of the VM (kind VirtualMachine), since they change its status and resourceVersion;
`watch` and `watch vmis` show them as VirtualMachineInstance. A cluster-scoped kind (kubevirt,
clusterinstancetype, clusterpreference) is in no namespace: its events are shown whatever -n
says, without -A. A --from-position past the log's head is refused (after up to 3 s for the
head to reach it), naming the head.

Examples:
  vmplane watch vms
  vmplane watch -A -o json
  vmplane get vms -o json | jq .metadata.resourceVersion   # then, without gap or repeat:
  vmplane watch vms --from-position 42"
    )]
    Watch(WatchArgs),

    /// Show every cluster feature's effective state, or which VMs use one.
    #[command(
        after_help = "Features come from the cluster configuration, a KubeVirt manifest an admin applies
(spec.configuration.developerConfiguration.featureGates / disabledFeatureGates).

Examples:
  vmplane features                            # NAME ENABLED SOURCE STAGE USED-BY
  vmplane features -o json
  vmplane features usage DownwardMetrics      # the VMs whose spec requests it"
    )]
    Features(FeaturesArgs),

    /// Snapshot a VM: a VirtualMachineSnapshot capturing it at one log position.
    #[command(after_help = "Examples:
  vmplane snapshot demo snap1
  vmplane get snapshot snap1 -o yaml")]
    Snapshot(SnapshotArgs),

    /// Restore a snapshot onto its VM, or into a new VM with --as (a VirtualMachineRestore).
    #[command(
        after_help = "A running target follows the restore's readiness policy (WaitGracePeriod: the
restore waits up to 5 minutes for the VM to stop). For StopTarget, apply a
VirtualMachineRestore manifest with `targetReadinessPolicy: StopTarget`.

Examples:
  vmplane restore demo --snapshot snap1
  vmplane restore demo --snapshot snap1 --as demo-restored
  vmplane get restore -o yaml"
    )]
    Restore(RestoreArgs),

    /// Clone a VM into a new VM with a new identity (a VirtualMachineClone).
    #[command(
        after_help = "Label and annotation filters, patches, new MACs: apply a VirtualMachineClone
manifest with `vmplane apply -f`.

Examples:
  vmplane clone demo demo2
  vmplane get clone -o yaml"
    )]
    Clone(CloneArgs),

    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  vmplane completion bash > /etc/bash_completion.d/vmplane\n  vmplane completion zsh > \"${fpath[1]}/_vmplane\""
    )]
    Completion(CompletionArgs),

    /// Disaster recovery: back up a running server's log, restore a data directory from a
    /// backup, verify a data directory (restore and verify run offline, without a server).
    #[command(after_help = "Examples:
  vmplane admin backup --out vmplane.backup
  vmplane admin restore --from vmplane.backup --data ./restored
  vmplane admin restore --from vmplane.backup --data ./restored --to-position 1200
  vmplane admin restore --from vmplane.backup --data ./restored --to-time 2026-11-22T10:00:00Z
  vmplane admin verify --data ./restored")]
    Admin(AdminArgs),
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Stream the whole log from the running server (admin role) into one self-verifying file.
    #[command(
        after_help = "Examples:\n  vmplane admin backup --out vmplane-$(date +%F).backup\n  VMPLANE_TOKEN=$OPS_TOKEN vmplane --server http://cp1:50051 admin backup --out cp1.backup"
    )]
    Backup {
        /// The backup file (written to FILE.tmp, synced, then renamed).
        #[arg(long)]
        out: PathBuf,
    },
    /// Offline: build a new data directory from a backup, or fill an existing empty one (a
    /// mount point); refuses a non-empty one, one another restore is building, a damaged
    /// backup, and a --to-position inside one commit.
    #[command(
        after_help = "Examples:\n  vmplane admin restore --from cp1.backup --data ./restored\n  vmplane admin restore --from cp1.backup --data ./before-the-mistake --to-time 2026-11-22T14:05:00Z\n  vmplane admin restore --from cp1.backup --data ./at-1200 --to-position 1200\n  vmplane admin restore --from cp1.backup --data ./as-file --backend file\nThen serve it with the same backend: vmplane serve --data ./restored (or --data ./as-file --backend file)"
    )]
    Restore {
        /// The backup file.
        #[arg(long)]
        from: PathBuf,
        /// The data directory to create (absent, or an empty directory).
        #[arg(long)]
        data: PathBuf,
        /// Keep events up to this position only.
        #[arg(long, conflicts_with = "to_time")]
        to_position: Option<u64>,
        /// Keep events recorded at or before this instant only (RFC 3339).
        #[arg(long)]
        to_time: Option<String>,
        /// The kind of log to build: `sled` (the default) or `file`; serve the directory with
        /// the same `--backend`. Also how to move a log from one embedded backend to the other:
        /// back it up, restore it with the other backend. `etcd` is refused: a restore builds an
        /// embedded log in --data, never an etcd one.
        #[arg(long, value_enum, default_value_t = Backend::Sled)]
        backend: Backend,
    },
    /// Offline: check a data directory's hash chain, positions, payloads, and projections
    /// against a rebuild; or, with --backend etcd, an etcd log's hash chain, positions, event
    /// ids and payloads (read-only, while its servers run).
    #[command(
        after_help = "Stop the server that serves DIR first: the log is opened exclusively.\n\nExamples:\n  vmplane admin verify --data ./vmplane-data\n  vmplane admin verify --data ./restored\n  vmplane admin verify --backend etcd --etcd-endpoints http://10.0.0.1:2379 --etcd-prefix vmplane"
    )]
    Verify {
        /// The data directory (an embedded log: sled or file, told apart by what it holds).
        #[arg(long, required_unless_present = "etcd_endpoints")]
        data: Option<PathBuf>,
        /// `etcd` to verify the log on an etcd cluster; without it, --data's embedded log.
        #[arg(long, value_enum)]
        backend: Option<Backend>,
        /// etcd client URLs, comma-separated (with `--backend etcd`).
        #[arg(
            long,
            value_name = "URL,...",
            value_delimiter = ',',
            required_if_eq("backend", "etcd")
        )]
        etcd_endpoints: Vec<String>,
        /// Key prefix of the etcd log (with `--backend etcd`).
        #[arg(long, value_name = "PREFIX", default_value = "vmplane")]
        etcd_prefix: String,
    },
}

/// Storage backends for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The embedded log on sled, in `--data`.
    Sled,
    /// The embedded log in one append-only file in `--data` (`events.vpl`), its indexes in
    /// memory: each commit is one write and one fdatasync, with no storage engine in between.
    /// Opening reads the whole file.
    File,
    /// The log on an etcd cluster (`--etcd-endpoints`), shared by several vmplane servers;
    /// `--data` then holds only this server's projection checkpoint.
    Etcd,
}

impl Backend {
    /// The backend's name as the CLI and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sled => "sled",
            Backend::File => "file",
            Backend::Etcd => "etcd",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Directory holding the log (created if missing).
    #[arg(long, value_name = "DIR", default_value = "./vmplane-data")]
    pub data: PathBuf,

    /// Address to serve gRPC on. Without --auth only loopback addresses are allowed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Storage backend of the log.
    #[arg(long, value_enum, default_value_t = Backend::Sled)]
    pub backend: Backend,

    /// etcd client URLs, comma-separated (with `--backend etcd`).
    #[arg(
        long,
        value_name = "URL,...",
        value_delimiter = ',',
        required_if_eq("backend", "etcd")
    )]
    pub etcd_endpoints: Vec<String>,

    /// With `--backend sled`: memory the log's page cache may hold, in MiB. The read models
    /// serve reads from memory of their own, so this cache only speeds up reads of history
    /// (time travel, audit, a state not in the state cache) and replays; a larger one trades
    /// resident memory for those (the log of 100,000 VMs is ~200 MiB once read through). sled
    /// bounds it loosely: a full read can leave more resident until later reads evict it.
    #[arg(long, value_name = "MIB", default_value_t = vmplane_store::SledOptions::DEFAULT_CACHE_MIB, value_parser = clap::value_parser!(u64).range(8..=1_048_576))]
    pub log_cache_mib: u64,

    /// With `--backend file`: how long, in microseconds, the log's committer waits at most
    /// for company before it writes and syncs a group. After a group of 8 appends or more, it
    /// waits until as many are queued again, and goes the moment they are. Many concurrent
    /// writers then keep sharing each `fdatasync` (150 against 0, medians of 9 pairs: 64
    /// clients 1.11× the creates/s and 0.81× the p99; 16 clients 1.03× and 0.91×). A few
    /// writers, whose groups are smaller, never wait. 0 never waits. [default: 150 with
    /// --backend file; sled and etcd have no such wait, and refuse a nonzero value]
    #[arg(long, value_name = "MICROSECONDS", value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub group_commit_linger_us: Option<u64>,

    /// Key prefix of the log in etcd: servers sharing a log use the same one.
    #[arg(long, value_name = "PREFIX", default_value = "vmplane")]
    pub etcd_prefix: String,

    /// With `--backend etcd`: the most operations one transaction may hold, which must not
    /// exceed any etcd member's `--max-txn-ops` (etcd's default, 128, is this flag's default
    /// and its least value). Only claims take operations of their own (an append's events share
    /// its commit's one batch key), so raising both together pays only when more than ~120
    /// appends that claim something (VM creates) wait at once.
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u64).range(128..=65536))]
    pub etcd_max_txn_ops: u64,

    /// With `--backend etcd`: TTL of the lease the reconciler's leader holds. When the leader
    /// stops renewing it (crash, pause, partition), another server takes over after at most
    /// this long.
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub leader_lease_seconds: u64,

    /// A libvirt node for the reconciler, as URI or NAME=URI (repeatable: one per node), or
    /// `none` to run without a reconciler. libvirt's test driver is real libvirt with
    /// simulated hosts.
    #[arg(
        long,
        value_name = "URI|NAME=URI|none",
        default_value = "test:///default"
    )]
    pub hypervisor: Vec<String>,

    /// Serve Prometheus metrics at http://ADDR/metrics (plain HTTP, even with --tls-cert).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Serve gRPC over TLS only, presenting this certificate (PEM; the server's certificate
    /// first, then any intermediates). Needs --tls-key. Clients then connect with
    /// --server https://HOST:PORT; the metrics endpoint stays plain HTTP.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, RSA or EC). Needs --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Tokens (as SHA-256 digests), principals and roles, in YAML. Without it every request
    /// acts as principal `local` (admin) and only loopback listening is allowed.
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,

    /// Threads serving requests (the async runtime's workers). Default: one fewer than the
    /// processors vmplane may use, at least 1, which leaves a processor to the log's committer
    /// and the projection follower, busy threads of their own under a write load (on 2
    /// processors: 1 worker, a lower latency tail at the same rate; PERFORMANCE.md).
    #[arg(long, value_name = "N", value_parser = TypedValueParser::map(
        clap::value_parser!(u16).range(1..=1024),
        usize::from,
    ))]
    pub worker_threads: Option<usize>,

    /// The gRPC listener's connections: cap, idle limit, opening deadline.
    #[command(flatten)]
    pub connections: crate::connections::ConnectionArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    /// File to read (YAML or JSON, several documents allowed), a directory (its .yaml, .yml
    /// and .json files, in name order), or `-` for standard input. May be given several times.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR|-",
        required = true
    )]
    pub file: Vec<String>,
    /// With a directory: read its subdirectories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Validate and decide on the server, change nothing (with -o json|yaml: print each
    /// object as it would be stored).
    #[arg(long)]
    pub dry_run: bool,
    /// Accept the update only if the object's generation is this one.
    #[arg(long, value_name = "N")]
    pub expected_generation: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    /// Kind of object (vm, vmi, instancetype, ...).
    pub kind: String,
    /// Name of one object; without it, a list.
    pub name: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// The object as it was at revision N of its stream: a row of `vmplane history` (not its
    /// generation: a start request or an observed VMI phase is a revision too).
    #[arg(long, value_name = "N", conflicts_with_all = ["at_position", "as_of"], requires = "name")]
    pub revision: Option<u64>,
    /// The object (or the list) as it was when the log's head was at this position.
    #[arg(long, value_name = "P", conflicts_with = "as_of")]
    pub at_position: Option<u64>,
    /// The object (or the list) as it was at this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
    pub as_of: Option<String>,
    /// A list is fetched in pages of this many objects (kubectl's default, 500), all read at
    /// the first page's position, so together they are one list; 0 fetches it in one response
    /// (refused when it is larger than a response may be).
    #[arg(long, value_name = "N", default_value_t = 500)]
    pub chunk_size: u32,
    /// Only objects whose labels match this selector, in Kubernetes' syntax: `app=web`,
    /// `app!=web`, `env in (prod,staging)`, `env notin (dev)`, `app` (has the label), `!app`
    /// (has not), comma-separated (all must hold).
    #[arg(short = 'l', long, value_name = "SELECTOR", value_parser = label_selector, conflicts_with = "name")]
    pub selector: Option<String>,
    /// The table gets a column for each of these label keys (comma-separated or repeated),
    /// headed by the key's last part in capitals, as kubectl's `-L`.
    #[arg(short = 'L', long, value_name = "KEY,...", value_delimiter = ',', value_parser = label_key)]
    pub label_columns: Vec<String>,
    /// The table gets a LABELS column: every label as key=value.
    #[arg(long)]
    pub show_labels: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    /// Kind of object.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub kind: Option<String>,
    /// Name of the object.
    #[arg(required_unless_present_any = ["file", "selector", "all_namespaces"], conflicts_with = "file")]
    pub name: Option<String>,
    /// Delete every object of KIND in the namespace whose labels match this selector
    /// (Kubernetes' syntax, as `get -l`).
    #[arg(short = 'l', long, value_name = "SELECTOR", value_parser = label_selector, conflicts_with_all = ["name", "file", "expected_generation"])]
    pub selector: Option<String>,
    /// Delete the objects a file names (YAML or JSON, several documents allowed), a directory
    /// (its .yaml, .yml and .json files, in name order), or `-` for standard input: each by
    /// its kind, name and namespace, as `apply -f` wrote them. May be given several times.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub file: Vec<String>,
    /// With a directory: read its subdirectories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// An object that does not exist is not an error (nothing to delete).
    #[arg(long)]
    pub ignore_not_found: bool,
    /// Delete only if the object's generation is this one.
    #[arg(long, value_name = "N", conflicts_with = "file")]
    pub expected_generation: Option<u64>,
    /// With -l: the matching objects of every namespace the caller may read.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    /// Name of the VM.
    pub name: String,
    /// Name of the VirtualMachineSnapshot.
    pub snapshot: String,
}

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// Name of the VM the snapshot was taken of.
    pub name: String,
    /// Name of the VirtualMachineSnapshot to restore.
    #[arg(long)]
    pub snapshot: String,
    /// Restore into a new VM of this name instead.
    #[arg(long = "as", value_name = "NEWNAME")]
    pub as_name: Option<String>,
    /// Name of the VirtualMachineRestore (default: TARGET-restore-RANDOM).
    #[arg(long = "restore-name")]
    pub restore_name: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct CloneArgs {
    /// Name of the source VM.
    pub name: String,
    /// Name of the new VM.
    pub new_name: String,
    /// Name of the VirtualMachineClone (default: NEWNAME-clone-RANDOM).
    #[arg(long = "clone-name")]
    pub clone_name: Option<String>,
}

/// How `patch` reads its patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PatchType {
    /// JSON merge patch (RFC 7386): objects merge, `null` removes a key, the rest replaces.
    Merge,
    /// JSON patch (RFC 6902): a list of add, remove, replace and test operations.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct PatchArgs {
    /// Kind of object (vm, instancetype, ...).
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// The patch, JSON or YAML.
    #[arg(
        short = 'p',
        long,
        value_name = "PATCH",
        required_unless_present = "patch_file",
        conflicts_with = "patch_file"
    )]
    pub patch: Option<String>,
    /// Read the patch from this file (`-` for standard input).
    #[arg(long, value_name = "FILE")]
    pub patch_file: Option<String>,
    /// How the patch is read.
    #[arg(long = "type", value_enum, default_value_t = PatchType::Merge)]
    pub patch_type: PatchType,
    /// Validate server-side and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct MetadataArgs {
    /// Kind of object (vm, instancetype, ...).
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// KEY=VALUE to set, KEY- to remove.
    #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
    pub changes: Vec<String>,
    /// Replace the value of a key the object has already.
    #[arg(long)]
    pub overwrite: bool,
    /// Validate server-side and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// What `wait` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitFor {
    /// `condition=TYPE[=STATUS]`: a `status.conditions[]` entry of that type with that status
    /// (`True` by default; both compared without case, as kubectl does).
    Condition {
        /// The condition's type.
        kind: String,
        /// The status it must have.
        status: String,
    },
    /// `jsonpath={.a.b[0].c}[=VALUE]`: the field has that value (as text), or exists.
    Field {
        /// The path as written.
        path: String,
        /// The same as a JSON pointer.
        pointer: String,
        /// The value it must have; `None`: any.
        value: Option<String>,
    },
    /// `create`: the object exists.
    Create,
    /// `delete`: the object does not exist.
    Delete,
}

impl std::fmt::Display for WaitFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitFor::Condition { kind, status } => write!(f, "condition {kind}={status}"),
            WaitFor::Field {
                path,
                value: Some(value),
                ..
            } => write!(f, "{{{path}}}={value}"),
            WaitFor::Field { path, .. } => write!(f, "{{{path}}} to exist"),
            WaitFor::Create => f.write_str("creation"),
            WaitFor::Delete => f.write_str("deletion"),
        }
    }
}

impl WaitFor {
    /// Whether `object` (`None`: it does not exist) is what is waited for; if not, what it is
    /// now, for the message when the wait times out.
    ///
    /// # Errors
    /// What the object is now, when it is not yet what is waited for.
    pub fn check(&self, object: Option<&serde_json::Value>) -> Result<(), String> {
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match (self, object) {
            (WaitFor::Delete, None) | (WaitFor::Create, Some(_)) => Ok(()),
            (WaitFor::Delete, Some(_)) => Err("it exists".into()),
            (_, None) => Err("it does not exist".into()),
            (WaitFor::Condition { kind, status }, Some(o)) => {
                let found = o
                    .pointer("/status/conditions")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|c| {
                        c.get("type")
                            .and_then(serde_json::Value::as_str)
                            .is_some_and(|t| t.eq_ignore_ascii_case(kind))
                    });
                match found {
                    None => Err(format!("it has no {kind} condition")),
                    Some(c) => {
                        let now = c.get("status").map(text).unwrap_or_default();
                        if now.eq_ignore_ascii_case(status) {
                            Ok(())
                        } else {
                            let why = c
                                .get("reason")
                                .map(text)
                                .filter(|r| !r.is_empty())
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default();
                            Err(format!("condition {kind} is {now}{why}"))
                        }
                    }
                }
            }
            (
                WaitFor::Field {
                    path,
                    pointer,
                    value,
                },
                Some(o),
            ) => match (o.pointer(pointer), value) {
                (None, _) => Err(format!("{{{path}}} is not set")),
                (Some(_), None) => Ok(()),
                (Some(now), Some(value)) if text(now) == *value => Ok(()),
                (Some(now), Some(_)) => Err(format!("{{{path}}} is {}", text(now))),
            },
        }
    }
}

/// `--for`: kubectl's forms.
fn wait_for(text: &str) -> Result<WaitFor, String> {
    const FORMS: &str = "write condition=TYPE[=STATUS], jsonpath='{.field.path}'[=VALUE], \
                         create or delete";
    if text == "delete" {
        return Ok(WaitFor::Delete);
    }
    if text == "create" {
        return Ok(WaitFor::Create);
    }
    if let Some(rest) = text.strip_prefix("condition=") {
        let (kind, status) = match rest.split_once('=') {
            Some((kind, status)) => (kind, status),
            None => (rest, "True"),
        };
        if kind.is_empty() || status.is_empty() {
            return Err(format!(
                "{text:?}: a condition needs a type (and a status after '='); {FORMS}"
            ));
        }
        return Ok(WaitFor::Condition {
            kind: kind.to_owned(),
            status: status.to_owned(),
        });
    }
    if let Some(rest) = text.strip_prefix("jsonpath=") {
        let rest = rest.trim_matches('\'');
        let Some(body) = rest.strip_prefix('{') else {
            return Err(format!(
                "{text:?}: a JSONPath is written in braces, as {{.status.phase}}"
            ));
        };
        let Some((path, after)) = body.split_once('}') else {
            return Err(format!(
                "{text:?}: the JSONPath's '{{' is not closed by '}}'"
            ));
        };
        let value = match after.trim_matches('\'') {
            "" => None,
            v => match v.strip_prefix('=') {
                Some(v) => Some(v.to_owned()),
                None => {
                    return Err(format!(
                        "{text:?}: after the JSONPath comes '=VALUE' or nothing"
                    ));
                }
            },
        };
        let pointer = json_pointer(path).map_err(|why| format!("{text:?}: {why}"))?;
        return Ok(WaitFor::Field {
            path: path.to_owned(),
            pointer,
            value,
        });
    }
    Err(format!("{text:?}: {FORMS}"))
}

/// `.a.b[0].c` as the JSON pointer `/a/b/0/c`: the JSONPath subset `wait` reads (fields and
/// array indices).
fn json_pointer(path: &str) -> Result<String, String> {
    let Some(path) = path.strip_prefix('.') else {
        return Err("the JSONPath starts with '.', as in {.status.phase}".into());
    };
    let mut pointer = String::new();
    for field in path.split('.') {
        let (name, indices) = match field.find('[') {
            Some(i) => (&field[..i], &field[i..]),
            None => (field, ""),
        };
        if name.is_empty() {
            return Err(format!("an empty field name in {path:?}"));
        }
        pointer.push('/');
        pointer.push_str(&name.replace('~', "~0").replace('/', "~1"));
        let mut rest = indices;
        while !rest.is_empty() {
            let Some((index, after)) = rest.strip_prefix('[').and_then(|r| r.split_once(']'))
            else {
                return Err(format!("{field:?}: an index is written [N]"));
            };
            if index.parse::<usize>().is_err() {
                return Err(format!(
                    "{field:?}: [{index}] is not an array index (filters are not supported)"
                ));
            }
            pointer.push('/');
            pointer.push_str(index);
            rest = after;
        }
    }
    Ok(pointer)
}

/// A duration as kubectl writes one: `30s`, `2m`, `1h30m`, `500ms` (a bare number is seconds).
fn duration(text: &str) -> Result<std::time::Duration, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(seconds));
    }
    let mut total = std::time::Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let n: u64 = number.parse().map_err(|_| {
            format!("{text:?} is not a duration: write it as 30s, 2m, 1h30m or 500ms")
        })?;
        let part = match unit {
            "ms" => std::time::Duration::from_millis(n),
            "s" => std::time::Duration::from_secs(n),
            "m" => std::time::Duration::from_secs(n * 60),
            "h" => std::time::Duration::from_secs(n * 3600),
            _ => {
                return Err(format!(
                    "{text:?} is not a duration: write it as 30s, 2m, 1h30m or 500ms"
                ));
            }
        };
        total += part;
        rest = after;
    }
    if text.is_empty() {
        return Err("an empty duration: write it as 30s, 2m, 1h30m or 500ms".into());
    }
    Ok(total)
}

#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Kind of object (vm, vmi, snapshot, ...).
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// condition=TYPE[=STATUS], jsonpath='{.field.path}'[=VALUE], create or delete.
    #[arg(long = "for", value_name = "CONDITION", value_parser = wait_for)]
    pub wait_for: WaitFor,
    /// Give up after this long (30s, 2m, 1h30m, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    pub timeout: std::time::Duration,
}

#[derive(Debug, Clone, Args)]
pub struct LifecycleArgs {
    /// Name of the VM.
    pub name: String,
}

#[derive(Debug, Clone, Args)]
pub struct ExpandArgs {
    /// `vm` (with NAME), or nothing with -f.
    #[arg(required_unless_present = "file")]
    pub kind: Option<String>,
    /// Name of the VM.
    #[arg(required_unless_present = "file")]
    pub name: Option<String>,
    /// Expand a manifest instead of a stored VM (`-` for standard input). May be given several
    /// times; together they hold one VirtualMachine.
    #[arg(short = 'f', long = "filename", value_name = "FILE", conflicts_with_all = ["kind", "name"])]
    pub file: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    /// `vm`.
    pub kind: String,
    /// Name of the VM.
    pub name: String,
    /// At most this many revisions, the newest (0: all of them); stderr says how many older
    /// ones were left out.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub limit: u32,
}

#[derive(Debug, Clone, Args)]
pub struct DescribeArgs {
    /// Kind of object (vm, vmi, snapshot, ...).
    pub kind: String,
    /// Name of the object.
    pub name: String,
    /// How many of its latest events to show (0: all of them).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub events: usize,
}

#[derive(Debug, Clone, Args)]
pub struct DiffArgs {
    /// `vm`.
    pub kind: String,
    /// Name of the VM.
    pub name: String,
    /// Older revision.
    #[arg(long, value_name = "REV")]
    pub from: u64,
    /// Newer revision (default: the current one).
    #[arg(long, value_name = "REV")]
    pub to: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// Only events caused by this principal.
    #[arg(long)]
    pub actor: Option<String>,
    /// Only events at or after this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
    pub since: Option<String>,
    /// Only events before this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
    pub until: Option<String>,
    /// Only events of this kind of object (a cluster-scoped kind's entries are in no
    /// namespace: shown whatever -n says).
    #[arg(long)]
    pub kind: Option<String>,
    /// Every namespace (the ones you may read).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// At most this many entries (newest last).
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Only objects of this kind.
    pub kind: Option<String>,
    /// Every namespace (the ones you may read).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Replay the events after this position first (a list's resourceVersion), then continue.
    #[arg(long, value_name = "P")]
    pub from_position: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// Shell to generate for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Clone, Args)]
pub struct FeaturesArgs {
    #[command(subcommand)]
    pub command: Option<FeaturesCommand>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum FeaturesCommand {
    /// The VMs whose spec requests FEATURE.
    #[command(after_help = "Examples:\n  vmplane features usage HostDevices -o json")]
    Usage {
        /// A KubeVirt feature gate name, e.g. DownwardMetrics.
        feature: String,
    },
}

/// A usage error of clap's (several lines: the error, tips, usage, a pointer to `--help`) as
/// the one line every vmplane error is: `vmplane: error: WHAT; WHAT TO DO (usage: …)`.
#[must_use]
pub fn usage_error_line(rendered: &str) -> String {
    let mut what = Vec::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(without_client_flags_in_usage(u));
        } else if line.starts_with("For more information") {
            continue;
        } else {
            let line = line.strip_prefix("error: ").unwrap_or(line);
            what.push(line.strip_prefix("tip: ").unwrap_or(line).to_string());
        }
    }
    let mut joined = String::new();
    for piece in what {
        if !joined.is_empty() {
            // "…were not provided:" is continued by what was not.
            joined.push_str(if joined.ends_with(':') { " " } else { "; " });
        }
        joined.push_str(&piece);
    }
    let mut out = format!("vmplane: error: {joined}");
    match usage {
        Some(usage) => out.push_str(&format!(" (usage: {usage}; see --help)")),
        None => out.push_str(" (see --help)"),
    }
    out
}

/// clap's usage lists the flags the command line gave, an environment variable's value
/// counted as given (`VMPLANE_SERVER` shows as `--server <SERVER>`). The client's global flags
/// are optional everywhere: a usage line leaves them out.
fn without_client_flags_in_usage(usage: &str) -> String {
    const FLAGS: [&str; 7] = [
        "--server",
        "--ca-cert",
        "--token",
        "--namespace",
        "-n",
        "--output",
        "-o",
    ];
    let mut kept = Vec::new();
    let mut tokens = usage.split(' ').peekable();
    while let Some(token) = tokens.next() {
        if FLAGS.contains(&token) && tokens.peek().is_some_and(|v| v.starts_with('<')) {
            tokens.next();
            continue;
        }
        kept.push(token);
    }
    kept.join(" ")
}

#[cfg(test)]
mod tests {
    use super::{duration, wait_for};

    #[test]
    fn etcd_flags_without_backend_etcd_are_refused_not_ignored() {
        for (flag, value) in [
            ("--etcd-endpoints", "http://127.0.0.1:2379"),
            ("--etcd-prefix", "other"),
            ("--etcd-max-txn-ops", "256"),
            ("--leader-lease-seconds", "9"),
        ] {
            for backend in [None, Some("sled"), Some("file")] {
                let mut args = vec!["vmplane", "serve", flag, value];
                if let Some(backend) = backend {
                    args.extend(["--backend", backend]);
                }
                let err = match Cli::parse_from_args(&args) {
                    Ok(_) => panic!("{args:?} was accepted"),
                    Err(err) => err.to_string(),
                };
                assert!(
                    err.contains(&format!("{flag} applies to --backend etcd only"))
                        && err
                            .contains(&format!("this is --backend {}", backend.unwrap_or("sled"))),
                    "{args:?}: {err}"
                );
            }
        }
        // With --backend etcd they are what they say; without any, nothing is refused.
        let etcd = [
            "vmplane",
            "serve",
            "--backend",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379",
            "--etcd-prefix",
            "p",
            "--etcd-max-txn-ops",
            "256",
            "--leader-lease-seconds",
            "9",
        ];
        assert!(Cli::parse_from_args(etcd).is_ok());
        assert!(Cli::parse_from_args(["vmplane", "serve"]).is_ok());
    }

    #[test]
    fn wait_for_reads_kubectls_forms_and_checks_objects() {
        use serde_json::json;
        let parse = |t: &str| wait_for(t).unwrap_or_else(|e| panic!("{e}"));
        let vm = json!({"status": {"printableStatus": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "Starting"}],
            "volumes": [{"name": "root"}]}});
        assert_eq!(
            parse("condition=Ready").check(Some(&vm)),
            Err("condition Ready is False (Starting)".into())
        );
        assert_eq!(parse("condition=ready=false").check(Some(&vm)), Ok(()));
        assert_eq!(
            parse("condition=Paused").check(Some(&vm)),
            Err("it has no Paused condition".into())
        );
        assert_eq!(
            parse("jsonpath={.status.printableStatus}=Running").check(Some(&vm)),
            Ok(())
        );
        assert_eq!(
            parse("jsonpath='{.status.volumes[0].name}'=root").check(Some(&vm)),
            Ok(())
        );
        assert_eq!(
            parse("jsonpath={.status.phase}").check(Some(&vm)),
            Err("{.status.phase} is not set".into())
        );
        assert_eq!(
            parse("jsonpath={.status.printableStatus}=Stopped").check(Some(&vm)),
            Err("{.status.printableStatus} is Running".into())
        );
        assert_eq!(parse("delete").check(None), Ok(()));
        assert_eq!(parse("delete").check(Some(&vm)), Err("it exists".into()));
        assert_eq!(parse("create").check(Some(&vm)), Ok(()));
        assert_eq!(
            parse("condition=Ready").check(None),
            Err("it does not exist".into())
        );
        for bad in [
            "ready",
            "condition=",
            "jsonpath=.status",
            "jsonpath={.a[x]}",
            "jsonpath={a}",
        ] {
            assert!(wait_for(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_are_written_as_kubectl_writes_them() {
        use std::time::Duration;
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("45"), Ok(Duration::from_secs(45)));
        for bad in ["", "s", "3d", "1.5s", "-1s"] {
            assert!(duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    use clap::CommandFactory;

    use super::{Cli, Command, usage_error_line};

    fn line_for(args: &[&str]) -> String {
        let err = Cli::parse_from_args(args).expect_err("a usage error");
        usage_error_line(&err.render().to_string())
    }

    #[test]
    fn a_usage_error_is_one_line_naming_what_is_wrong_and_the_usage() {
        let line = line_for(&["vmplane", "get"]);
        assert!(!line.contains('\n'), "{line}");
        assert_eq!(
            line,
            "vmplane: error: the following required arguments were not provided: <KIND> \
             (usage: vmplane get <KIND> [NAME]; see --help)"
        );
        let line = line_for(&["vmplane", "get", "vms", "-o", "xml"]);
        assert!(
            !line.contains('\n')
                && line.contains("'xml'")
                && line.contains("table, wide, yaml, json, name"),
            "{line}"
        );
        let line = line_for(&["vmplane", "frob"]);
        assert!(line.contains("unrecognized subcommand 'frob'"), "{line}");
    }

    fn parsed(args: &[&str]) -> Cli {
        Cli::parse_from_args(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn the_usage_line_leaves_out_client_flags_given_on_the_command_line_or_by_the_environment() {
        // clap counts a flag with a value (typed, or from VMPLANE_SERVER) as used, and lists
        // it in the usage as if it were required.
        for args in [
            &["vmplane", "get", "--server", "http://h:1"][..],
            &[
                "vmplane",
                "--server",
                "http://h:1",
                "-n",
                "x",
                "get",
                "-o",
                "json",
            ],
            &["vmplane", "get", "--token", "t", "--ca-cert", "ca.pem"],
        ] {
            let line = line_for(args);
            assert!(
                line.ends_with("(usage: vmplane get <KIND> [NAME]; see --help)"),
                "{args:?}: {line}"
            );
        }
    }

    #[test]
    fn a_name_with_all_namespaces_is_a_usage_error() {
        let line = line_for(&["vmplane", "get", "vm", "demo", "-A"]);
        assert!(
            line.starts_with(
                "vmplane: error: a resource cannot be retrieved by name across all namespaces; "
            ) && line.contains("usage: vmplane get"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        // A list across namespaces, or one object in one, are fine.
        parsed(&["vmplane", "get", "vms", "-A"]);
        parsed(&["vmplane", "get", "vm", "demo", "-n", "a"]);
    }

    #[test]
    fn output_name_is_refused_for_a_command_that_prints_no_objects() {
        for command in [
            &["history", "vm", "demo"][..],
            &["audit"],
            &["watch"],
            &["features"],
            &["expand", "vm", "demo"],
            &["diff", "vm", "demo", "--from", "1"],
            &["start", "demo"],
            &["admin", "backup", "--out", "b"],
        ] {
            let args: Vec<&str> = ["vmplane"]
                .iter()
                .chain(command)
                .chain(&["-o", "name"])
                .copied()
                .collect();
            let line = line_for(&args);
            assert!(
                line.starts_with(&format!(
                    "vmplane: error: -o name prints object names, and `{}` prints none; use -o \
                     table, yaml or json",
                    command[0]
                )) && line.contains(&format!("usage: vmplane {}", command[0])),
                "{args:?}: {line}"
            );
        }
        for command in [
            &["get", "vms"][..],
            &["get", "vm", "demo"],
            &["apply", "-f", "x"],
            &["import", "-f", "x"],
            &["delete", "vm", "demo"],
            &["snapshot", "demo", "s"],
            &["restore", "demo", "--snapshot", "s"],
            &["clone", "demo", "demo2"],
            // The client's flags mean nothing to these two: accepted and ignored, as before.
            &["serve"],
            &["completion", "bash"],
        ] {
            let args: Vec<&str> = ["vmplane", "-o", "name"]
                .iter()
                .chain(command)
                .copied()
                .collect();
            parsed(&args);
        }
    }

    #[test]
    fn delete_takes_a_kind_and_name_or_a_file_never_both() {
        parsed(&["vmplane", "delete", "vm", "demo"]);
        parsed(&["vmplane", "delete", "-f", "x.yaml"]);
        parsed(&["vmplane", "delete", "-f", "dir", "-R", "--ignore-not-found"]);
        for (args, says) in [
            (
                &["vmplane", "delete", "vm"][..],
                "required arguments were not provided",
            ),
            (
                &["vmplane", "delete"],
                "required arguments were not provided",
            ),
            (
                &["vmplane", "delete", "vm", "demo", "-f", "x.yaml"],
                "cannot be used with '--filename",
            ),
            (
                &["vmplane", "delete", "vm", "demo", "-R"],
                "-R reads a directory's subdirectories: give the directory with -f DIR",
            ),
            (
                &[
                    "vmplane",
                    "delete",
                    "-f",
                    "x.yaml",
                    "--expected-generation",
                    "2",
                ],
                "cannot be used with",
            ),
        ] {
            let line = line_for(args);
            assert!(line.contains(says), "{args:?}: {line}");
        }
    }

    #[test]
    fn whether_the_namespace_was_given_explicitly_is_known_wherever_it_was_given() {
        for (args, explicit) in [
            (&["vmplane", "apply", "-f", "x"][..], false),
            (&["vmplane", "-n", "a", "apply", "-f", "x"], true),
            (&["vmplane", "apply", "-f", "x", "--namespace", "a"], true),
            (&["vmplane", "apply", "-f", "x", "-n", "default"], true),
        ] {
            assert_eq!(parsed(args).global.namespace_explicit, explicit, "{args:?}");
        }
    }

    #[test]
    fn a_bad_time_flag_is_refused_naming_the_flag() {
        for (args, flag) in [
            (
                &["vmplane", "get", "vm", "d", "--as-of", "yesterday"][..],
                "--as-of",
            ),
            (&["vmplane", "audit", "--since", "yesterday"], "--since"),
            (&["vmplane", "audit", "--until", "soon"], "--until"),
        ] {
            let line = line_for(args);
            assert!(
                line.contains(&format!("'{flag} <RFC3339>'")) && line.contains("RFC 3339"),
                "{line}"
            );
        }
        let cli = parsed(&["vmplane", "get", "vms", "--as-of", "2026-11-22T14:05:00Z"]);
        let Command::Get(get) = cli.command else {
            panic!("get")
        };
        assert_eq!(get.as_of.as_deref(), Some("2026-11-22T14:05:00Z"));
    }

    #[test]
    fn serve_and_completion_help_leave_out_the_client_flags_which_stay_global_elsewhere() {
        let mut cmd = Cli::command();
        cmd.build();
        for name in ["serve", "completion"] {
            let sub = cmd.find_subcommand_mut(name).expect("subcommand");
            let help = sub.render_long_help().to_string();
            for flag in [
                "--server <SERVER>",
                "--token <TOKEN>",
                "--ca-cert <FILE>",
                "--namespace <NAMESPACE>",
                "--output <OUTPUT>",
            ] {
                assert!(!help.contains(flag), "{name} --help lists {flag}:\n{help}");
            }
        }
        let get = cmd.find_subcommand_mut("get").expect("get");
        assert!(
            get.render_long_help()
                .to_string()
                .contains("--server <SERVER>")
        );
        for args in [
            &["vmplane", "--server", "http://h:1", "get", "vms"][..],
            &["vmplane", "get", "vms", "--server", "http://h:1"],
        ] {
            assert_eq!(parsed(args).global.server, "http://h:1", "{args:?}");
        }
        // Still accepted by serve, as before (and ignored).
        parsed(&["vmplane", "serve", "--server", "http://h:1"]);
        parsed(&["vmplane", "--server", "http://h:1", "serve"]);
    }
}
