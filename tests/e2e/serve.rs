//! `vmplane serve`: opens the log, serves health and reflection, refuses unsafe listens, exits
//! cleanly on SIGTERM.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use vmplane_gateway::pb::{LogInfoRequest, admin_client::AdminClient};
use vmplane_tests::{Server, run_cli};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn channel(server: &Server) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(server.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect to vmplane")
}

#[test]
fn serve_answers_health_checks_as_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    rt().block_on(async {
        let mut health = HealthClient::new(channel(&server).await);
        // The overall server ("") and the Admin service both report SERVING.
        for service in ["", "vmplane.v1.Admin"] {
            let resp = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health check")
                .into_inner();
            assert_eq!(resp.status(), ServingStatus::Serving, "service {service:?}");
        }
    });
}

#[test]
fn serve_answers_health_checks_for_every_vmplane_service_by_name() {
    use vmplane_gateway::pb;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    rt().block_on(async {
        let mut health = HealthClient::new(channel(&server).await);
        for service in [
            pb::objects_server::SERVICE_NAME,
            pb::lifecycle_server::SERVICE_NAME,
            pb::history_server::SERVICE_NAME,
            pb::watch_server::SERVICE_NAME,
            pb::cluster_server::SERVICE_NAME,
            pb::admin_server::SERVICE_NAME,
        ] {
            let resp = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap_or_else(|status| panic!("health check of {service}: {status}"))
                .into_inner();
            assert_eq!(resp.status(), ServingStatus::Serving, "service {service:?}");
        }
        // A name no service has is still NOT_FOUND.
        let unknown = health
            .check(HealthCheckRequest {
                service: "vmplane.v1.NoSuchService".into(),
            })
            .await
            .expect_err("an unknown service is not found");
        assert_eq!(unknown.code(), tonic::Code::NotFound);
    });
}

#[test]
fn serve_lists_its_services_through_reflection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let services = rt().block_on(async {
        let mut client = ServerReflectionClient::new(channel(&server).await);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .expect("reflection call")
            .into_inner();
        let resp = stream
            .message()
            .await
            .expect("reflection answer")
            .expect("one answer");
        match resp.message_response {
            Some(MessageResponse::ListServicesResponse(list)) => {
                list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
            }
            other => panic!("unexpected reflection answer {other:?}"),
        }
    });
    for want in ["vmplane.v1.Admin", "grpc.health.v1.Health"] {
        assert!(
            services.iter().any(|s| s == want),
            "{want} missing from {services:?}"
        );
    }
}

#[test]
fn serve_reports_the_head_of_an_existing_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let appended = crate::fixtures::append_events(&data, 7);
    let server = Server::start(&data, &[]);
    let info = rt().block_on(async {
        AdminClient::new(channel(&server).await)
            .log_info(LogInfoRequest {})
            .await
            .expect("log info")
            .into_inner()
    });
    assert_eq!(info.head_position, appended);
    assert_eq!(info.backend, "sled");
}

#[test]
fn serve_refuses_a_non_loopback_listen_without_auth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8 path");
    let (code, _out, err) = run_cli(&["serve", "--data", data, "--listen", "0.0.0.0:0"]);
    assert_ne!(
        code, 0,
        "a non-loopback listen without --auth must be refused"
    );
    assert!(
        err.contains("--listen") && err.contains("--auth"),
        "unclear error: {err}"
    );
    assert!(
        !std::path::Path::new(data).exists(),
        "a refused start must not create the data dir"
    );
}

#[test]
fn serve_exits_cleanly_on_sigterm_and_reopens_the_same_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let status = server.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    // The log is closed cleanly: a second server opens it.
    let server = Server::start(&data, &[]);
    assert!(server.stderr().contains("ready"), "{}", server.stderr());
}

#[test]
fn serve_exits_on_sigterm_with_a_watch_open_and_tells_the_watcher_where_to_continue() {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let vmplane = vmplane_tests::Cli::new(&server);
    let vm = vmplane_tests::repo_root().join("examples/vm.yaml");
    let vm = vm.to_str().expect("utf-8 path");
    let mut watch = vmplane.spawn(&["watch", "-A", "-o", "json", "--from-position", "0"]);
    vmplane.ok(&["apply", "-f", vm]);
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("an event").expect("read the watch");
    assert!(first.contains("VirtualMachine"), "{first}");
    // Well under the server's drain bound: an open watch must not hold the shutdown.
    let status = server.terminate(Duration::from_secs(5));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let ended = watch.wait().expect("the watch ends");
    assert!(!ended.success(), "a watch cut by the server fails: {ended}");
    let mut stderr = String::new();
    watch
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let line = vmplane_tests::one_error_line(&stderr);
    assert!(
        line.contains("shutting down") && line.contains("--from-position"),
        "{line}"
    );
}

/// Asserts that `serve` with `flag value` is refused, naming the flag, before it creates its
/// data dir; returns a temporary directory and the data dir (in it) the refused start left alone.
fn assert_serve_refuses(flag: &str, value: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let path = data.to_str().expect("utf-8 path");
    let (code, _out, err) = run_cli(&[
        "serve",
        "--data",
        path,
        "--listen",
        "127.0.0.1:0",
        flag,
        value,
    ]);
    assert_ne!(code, 0, "serve {flag} {value} must be refused");
    assert!(err.contains(flag), "unclear error: {err}");
    assert!(
        !data.exists(),
        "a refused start must not create the data dir"
    );
    (dir, data)
}

#[test]
fn serve_takes_a_log_cache_size_and_refuses_one_below_its_least() {
    let (_dir, data) = assert_serve_refuses("--log-cache-mib", "4");
    // The least size serves, and a log written with it reopens with the default.
    let server = Server::start(&data, &["--log-cache-mib", "8"]);
    let status = server.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let server = Server::start(&data, &[]);
    assert!(server.stderr().contains("ready"), "{}", server.stderr());
}

#[test]
fn serve_lingers_for_group_commits_on_the_file_backend_only() {
    // sled (the default backend) has no such committer: refused, naming the flag.
    let (_dir, data) = assert_serve_refuses("--group-commit-linger-us", "150");
    let (_dir, _) = assert_serve_refuses("--group-commit-linger-us", "10001");
    // Its default (150 µs on the file backend) is not a flag given: sled serves without it, and
    // takes an explicit 0, which asks for what sled does anyway.
    let (_sled_dir, sled_data) = assert_serve_refuses("--group-commit-linger-us", "1");
    for flags in [&[][..], &["--group-commit-linger-us", "0"][..]] {
        let server = Server::start(&sled_data, flags);
        let status = server.terminate(Duration::from_secs(30));
        assert!(
            status.success(),
            "{flags:?}: exit status after SIGTERM: {status}"
        );
    }
    for flags in [
        &["--backend", "file", "--group-commit-linger-us", "150"][..],
        &["--backend", "file", "--group-commit-linger-us", "0"][..],
        &["--backend", "file"][..],
    ] {
        let server = Server::start(&data, flags);
        let status = server.terminate(Duration::from_secs(30));
        assert!(
            status.success(),
            "{flags:?}: exit status after SIGTERM: {status}"
        );
    }
}

#[test]
fn serve_runs_the_worker_threads_asked_for_and_refuses_zero() {
    let (_dir, data) = assert_serve_refuses("--worker-threads", "0");
    let server = Server::start(&data, &["--worker-threads", "3"]);
    let stderr = server.stderr();
    assert!(stderr.contains("workers=3"), "{stderr}");
    let status = server.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

#[test]
fn serve_reports_a_damaged_log_as_an_error_without_panicking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    crate::fixtures::append_events(&data, 3);
    crate::fixtures::damage_log(&data);
    let data = data.to_str().expect("utf-8 path");
    let (code, _out, err) = run_cli(&["serve", "--data", data, "--listen", "127.0.0.1:0"]);
    assert_ne!(code, 0, "a damaged log must not be served");
    assert!(!err.contains("panicked"), "the server panicked: {err}");
    assert!(
        err.contains("vmplane: error:"),
        "no clear error line: {err}"
    );
}

#[test]
fn serve_refuses_a_hypervisor_it_cannot_open_with_the_cause_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-node.xml");
    let uri = format!("test://{}", missing.display());
    let (_dir, _data) = assert_serve_refuses("--hypervisor", &uri);
    let data = dir.path().join("data");
    let (code, _out, err) = run_cli(&[
        "serve",
        "--data",
        data.to_str().expect("utf-8 path"),
        "--listen",
        "127.0.0.1:0",
        "--hypervisor",
        &uri,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("ready"), "refused before serving: {err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("vmplane: error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains(&format!("--hypervisor node1={uri}")),
        "{line}"
    );
    assert!(
        line.contains("--hypervisor none"),
        "says what to do: {line}"
    );
    assert_eq!(
        line.matches("failed to parse xml document").count(),
        1,
        "the cause once: {line}"
    );
}

/// Reads `stream` to its end: each status it sends, then how it ended (`ended Unavailable`).
async fn health_watch_to_its_end(
    service: &str,
    mut stream: tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(status)) => seen.push(format!("{service:?}: {:?}", status.status())),
            Ok(None) => {
                seen.push(format!("{service:?}: ended Ok"));
                return seen;
            }
            Err(status) => {
                seen.push(format!("{service:?}: ended {:?}", status.code()));
                return seen;
            }
        }
    }
}

#[test]
fn serve_tells_health_watchers_not_serving_on_sigterm_and_exits_without_waiting_for_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &[]);
    let url = server.url.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    // The watcher keeps its connection served on a thread of its own while this one waits for
    // the server's exit.
    let watcher = std::thread::spawn(move || {
        rt().block_on(async move {
            let channel = tonic::transport::Channel::from_shared(url)
                .expect("url")
                .connect()
                .await
                .expect("connect to vmplane");
            let mut health = HealthClient::new(channel);
            let mut watches = Vec::new();
            for service in ["", vmplane_gateway::pb::objects_server::SERVICE_NAME] {
                let mut stream = health
                    .watch(HealthCheckRequest {
                        service: service.into(),
                    })
                    .await
                    .expect("health watch")
                    .into_inner();
                let first = stream
                    .message()
                    .await
                    .expect("a status")
                    .expect("the current status");
                assert_eq!(first.status(), ServingStatus::Serving, "{service:?}");
                watches.push((service, stream));
            }
            ready_tx.send(()).expect("the test waits");
            let mut watches = watches.into_iter();
            let (a, b) = (watches.next().expect("two"), watches.next().expect("two"));
            let (a, b) = tokio::join!(
                health_watch_to_its_end(a.0, a.1),
                health_watch_to_its_end(b.0, b.1)
            );
            [a, b].concat()
        })
    });
    ready
        .recv_timeout(Duration::from_secs(30))
        .expect("both watches see SERVING");
    // 8 s only guards against a hang (the drain's bound is 10 s): the assert is the exit.
    let status = server.terminate(Duration::from_secs(8));
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let seen = watcher.join().expect("the watcher");
    assert_eq!(
        seen,
        [
            r#""": NotServing"#,
            r#""": ended Unavailable"#,
            r#""vmplane.v1.Objects": NotServing"#,
            r#""vmplane.v1.Objects": ended Unavailable"#,
        ]
    );
}

#[test]
fn serve_refuses_an_oversized_request_to_any_service_and_speaks_of_manifests_only_to_apply() {
    use vmplane_gateway::pb::{
        ApplyRequest, FeatureUsageRequest, GetRequest, LifecycleRequest, ObjectRef,
        cluster_client::ClusterClient, lifecycle_client::LifecycleClient,
        objects_client::ObjectsClient,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(&dir.path().join("data"), &["--hypervisor", "none"]);
    // Over the server's request limit (a manifest's 1 MiB and framing), under tonic's 4 MiB.
    let big = "a".repeat(2_000_000);
    let refusals = rt().block_on(async {
        let channel = channel(&server).await;
        let cluster = ClusterClient::new(channel.clone())
            .feature_usage(FeatureUsageRequest {
                feature: big.clone(),
            })
            .await;
        let lifecycle = LifecycleClient::new(channel.clone())
            .start(LifecycleRequest {
                name: big.clone(),
                ..Default::default()
            })
            .await;
        let get = ObjectsClient::new(channel.clone())
            .get(GetRequest {
                r#ref: Some(ObjectRef {
                    kind: "vm".into(),
                    namespace: "default".into(),
                    name: big.clone(),
                }),
                ..Default::default()
            })
            .await;
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: big.clone(),
            })
            .await;
        let apply = ObjectsClient::new(channel.clone())
            .apply(ApplyRequest {
                manifest: big.clone(),
                ..Default::default()
            })
            .await;
        [
            ("Cluster/FeatureUsage", cluster.map(drop)),
            ("Lifecycle/Start", lifecycle.map(drop)),
            ("Objects/Get", get.map(drop)),
            ("Health/Check", health.map(drop)),
            ("Objects/Apply", apply.map(drop)),
        ]
    });
    for (method, refused) in refusals {
        let status = refused.expect_err(method);
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{method}: {status:?}"
        );
        let message = status.message();
        assert!(
            message.starts_with("request: ")
                && message.contains("bytes, more than the 1114112 bytes a request may hold"),
            "{method}: {message}"
        );
        assert_eq!(
            message.contains("manifest") && message.contains("split the file"),
            method == "Objects/Apply",
            "{method}: {message}"
        );
    }
}

#[test]
fn serve_refuses_a_listen_or_metrics_address_in_use_naming_it_before_it_creates_its_data_dir() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("its address").to_string();
    for args in [
        vec!["--listen", addr.as_str()],
        vec!["--listen", "127.0.0.1:0", "--metrics-listen", addr.as_str()],
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let mut command = vec!["serve", "--data", data.to_str().expect("utf-8 path")];
        command.extend(&args);
        let (code, _out, err) = run_cli(&command);
        assert_ne!(code, 0, "{args:?}: {err}");
        let flag = args[args.len() - 2];
        assert!(
            err.contains(&format!("{flag} {addr}: cannot bind")),
            "{args:?}: unclear error: {err}"
        );
        assert!(
            !data.exists(),
            "{args:?}: a refused start must not create the data dir"
        );
    }
}
