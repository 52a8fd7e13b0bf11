//! `--metrics-listen`: Prometheus metrics by method and final code (a stream's when it ends),
//! log position, lag, VMs by status; and the tracing span of every request.

use std::time::{Duration, Instant};

use vmplane_tests::{Cli, Server, free_port, run_cli, scrape};

use crate::{channel, rt};

#[test]
fn metrics_count_requests_by_method_and_code_and_report_vms_by_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start(&dir.path().join("data"), &["--metrics-listen", &listen]);
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vm.yaml");
    let (code, _, err) = run_cli(&["--server", &server.url, "apply", "-f", examples]);
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = run_cli(&["--server", &server.url, "get", "vm", "missing"]);
    assert_ne!(code, 0);

    let text = scrape(port);
    for want in [
        r#"vmplane_grpc_server_handled_total{method="/vmplane.v1.Objects/Apply",code="OK"} 1"#,
        r#"vmplane_grpc_server_handled_total{method="/vmplane.v1.Objects/Get",code="NotFound"} 1"#,
        r#"vmplane_grpc_server_handling_seconds_count{method="/vmplane.v1.Objects/Apply",code="OK"} 1"#,
        r#"vmplane_grpc_server_handling_seconds_count{method="/vmplane.v1.Objects/Get",code="NotFound"} 1"#,
        "vmplane_log_head_position 1",
        "vmplane_projection_lag_events 0",
        r#"vmplane_vms{status="Stopped"} 1"#,
        "vmplane_vmi_feature_mismatch 0",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The body is OpenMetrics text (`# EOF` last, `_total` only on samples), so the content
    // type must say so: a scraper told `text/plain; version=0.0.4` parses it as the older format.
    let (head, body) = text.split_once("\r\n\r\n").expect("headers, then the body");
    assert!(
        head.lines().any(|l| l.eq_ignore_ascii_case(
            "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
        )),
        "{head}"
    );
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
}

/// The server's `--metrics-listen` port and the server (no hypervisor: nothing runs a VM).
fn metrics_server(dir: &std::path::Path) -> (Server, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = Server::start(
        &dir.join("data"),
        &["--hypervisor", "none", "--metrics-listen", &listen],
    );
    (server, port)
}

/// A gRPC call to `path`, whatever it is; the code it answered.
async fn call_path(channel: tonic::transport::Channel, path: &str) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("channel ready");
    let path: tonic::codegen::http::uri::PathAndQuery = path.parse().expect("a path");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    match grpc.unary(tonic::Request::new(()), path, codec).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

#[test]
fn requests_to_made_up_paths_share_one_unknown_method_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, port) = metrics_server(dir.path());
    let junk = 40;
    rt().block_on(async {
        let channel = channel(&server).await;
        for i in 0..junk {
            let code = call_path(channel.clone(), &format!("/junk{i}.Service/Method{i}")).await;
            assert_eq!(code, tonic::Code::Unimplemented);
        }
        // A real method keeps its own series.
        let code = call_path(channel.clone(), "/grpc.health.v1.Health/Check").await;
        assert_eq!(code, tonic::Code::Ok);
    });
    let text = scrape(port);
    assert!(
        !text.contains("junk"),
        "a made-up path names a series:\n{text}"
    );
    for want in [
        format!(
            r#"vmplane_grpc_server_handled_total{{method="unknown",code="Unimplemented"}} {junk}"#
        ),
        format!(
            r#"vmplane_grpc_server_handling_seconds_count{{method="unknown",code="Unimplemented"}} {junk}"#
        ),
        r#"vmplane_grpc_server_handled_total{method="/grpc.health.v1.Health/Check",code="OK"} 1"#
            .to_string(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn a_vm_status_no_vm_has_is_reported_as_zero_not_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, port) = metrics_server(dir.path());
    let cli = Cli::new(&server);
    // Before any VM: every printableStatus is there, at 0.
    let text = scrape(port);
    for status in ["Stopped", "Running", "Starting", "Unknown"] {
        let want = format!(r#"vmplane_vms{{status="{status}"}} 0"#);
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vm.yaml");
    cli.ok(&["apply", "-f", examples]);
    let text = scrape(port);
    assert!(
        text.contains(r#"vmplane_vms{status="Stopped"} 1"#),
        "{text}"
    );
    // The last Stopped VM goes: the series drops to 0, it does not vanish.
    cli.ok(&["delete", "vm", "demo"]);
    let text = scrape(port);
    assert!(
        text.contains(r#"vmplane_vms{status="Stopped"} 0"#),
        "{text}"
    );
}

#[test]
fn a_request_span_names_the_principal_and_the_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The span's fields are written with each event inside it: "request done" is a debug one.
    let server = Server::start_logging(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--hypervisor", "none"],
        "info,vmplane_gateway=debug",
    );
    let cli = Cli::new(&server);
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/vm.yaml");
    cli.ok(&["apply", "-f", examples]);
    cli.ok(&["get", "vm", "demo"]);
    cli.fails(&["get", "vm", "nope"]);
    cli.ok(&["get", "vms"]);
    cli.ok(&["history", "vm", "demo"]);
    let wanted = [
        (
            "/vmplane.v1.Objects/Apply",
            "object=VirtualMachine default/demo}",
        ),
        (
            "/vmplane.v1.Objects/Get",
            "object=VirtualMachine default/demo}",
        ),
        (
            "/vmplane.v1.Objects/Get",
            "object=VirtualMachine default/nope}",
        ),
        ("/vmplane.v1.Objects/List", "object=VirtualMachine default}"),
        (
            "/vmplane.v1.History/History",
            "object=VirtualMachine default/demo}",
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = server.stderr();
        let missing: Vec<_> = wanted
            .iter()
            .filter(|(method, object)| {
                !log.lines().any(|l| {
                    l.contains("request done")
                        && l.contains(&format!("grpc{{method={method} "))
                        && l.contains(r#"principal="local""#)
                        && l.contains(object)
                })
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no span with {missing:?} in the server's log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `handled_total` samples of `method` in the scrape `text`.
fn handled_of(text: &str, method: &str) -> Vec<String> {
    let series = format!(r#"vmplane_grpc_server_handled_total{{method="{method}","#);
    text.lines()
        .filter(|l| l.starts_with(&series))
        .map(str::to_string)
        .collect()
}

#[test]
fn streams_are_counted_when_they_end_by_their_final_code_not_when_they_start() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use vmplane_gateway::pb::{
        BackupRequest, WatchRequest, admin_client::AdminClient, watch_client::WatchClient,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, port) = metrics_server(dir.path());
    let (watch, health_watch, backup) = (
        "/vmplane.v1.Watch/Watch",
        "/grpc.health.v1.Health/Watch",
        "/vmplane.v1.Admin/Backup",
    );
    rt().block_on(async {
        let channel = channel(&server).await;
        let events = WatchClient::new(channel.clone())
            .watch(WatchRequest {
                all_namespaces: true,
                ..Default::default()
            })
            .await
            .expect("watch")
            .into_inner();
        let mut statuses = HealthClient::new(channel.clone())
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health watch")
            .into_inner();
        let first = statuses.message().await.expect("a status").expect("one");
        assert_eq!(first.status(), ServingStatus::Serving);
        // A backup streams to its end, and is counted then.
        let mut chunks = AdminClient::new(channel.clone())
            .backup(BackupRequest {})
            .await
            .expect("backup")
            .into_inner();
        while chunks.message().await.expect("a chunk").is_some() {}

        let text = scrape(port);
        for open in [watch, health_watch] {
            assert_eq!(
                handled_of(&text, open),
                Vec::<String>::new(),
                "an open stream is counted:\n{text}"
            );
        }
        assert_eq!(
            handled_of(&text, backup),
            [format!(
                r#"vmplane_grpc_server_handled_total{{method="{backup}",code="OK"}} 1"#
            )],
            "{text}"
        );

        // The client goes away: each stream ends then, cancelled.
        drop(events);
        drop(statuses);
        let want = |method: &str| {
            [format!(
                r#"vmplane_grpc_server_handled_total{{method="{method}",code="Canceled"}} 1"#
            )]
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Lets the connection's task send the streams' resets.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let text = scrape(port);
            if handled_of(&text, watch) == want(watch)
                && handled_of(&text, health_watch) == want(health_watch)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cancelled streams not counted as Canceled:\n{text}"
            );
        }
    });
}
