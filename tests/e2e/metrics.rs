//! `--metrics-listen`: Prometheus metrics by method and code, log position, lag, VMs by status.

use std::io::{Read, Write};

use vmplane_tests::{Server, run_cli};

/// Picks a free loopback port for the metrics listener (the gRPC one is chosen by the server).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out
}

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
        r#"vmplane_grpc_server_handled_total{method="/vmplane.v1.Objects/Apply",code="Ok"} 1"#,
        r#"vmplane_grpc_server_handled_total{method="/vmplane.v1.Objects/Get",code="NotFound"} 1"#,
        r#"vmplane_grpc_server_handling_seconds_count{method="/vmplane.v1.Objects/Apply",code="Ok"} 1"#,
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
