//! TLS: `serve --tls-cert/--tls-key` serves gRPC over TLS; a client with `--server https://...`
//! verifies it against `--ca-cert` and never falls back to plaintext; every mismatch (an
//! untrusted certificate, https against plaintext, http against TLS, a missing or bad key) is
//! one clear line and changes nothing. The certificates are made here, with rcgen.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use vmplane_tests::{AuthToken, Cli, Server, repo_root, run_cli, write_auth_file};

use crate::rt;

const OPS: &str = "ops-tls-4b1e9c7d2a6f";

/// A CA and a server certificate it signed for 127.0.0.1 and localhost (PEM files in a
/// temporary directory), and a second CA that signed nothing the server presents.
struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_ca: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_params = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params
        };
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = ca_params("vmplane e2e CA")
            .self_signed(&ca_key)
            .expect("CA certificate");
        let issuer = Issuer::new(ca_params("vmplane e2e CA"), ca_key);
        let other_key = KeyPair::generate().expect("other CA key");
        let other_ca = ca_params("some other CA")
            .self_signed(&other_key)
            .expect("other CA certificate");
        let server_key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "vmplane e2e server");
        let server = params
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        Pki {
            ca: write("ca.pem", ca.pem()),
            cert: write("server.pem", server.pem()),
            key: write("server-key.pem", server_key.serialize_pem()),
            other_ca: write("other-ca.pem", other_ca.pem()),
            dir,
        }
    }

    /// `--tls-cert CERT --tls-key KEY`, as `serve` arguments.
    fn serve_args(&self) -> Vec<&str> {
        vec![
            "--tls-cert",
            path_str(&self.cert),
            "--tls-key",
            path_str(&self.key),
        ]
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn example_vm() -> String {
    std::fs::read_to_string(repo_root().join("examples/vm.yaml")).expect("read examples/vm.yaml")
}

/// Every event the server holds, as an admin sees it through `audit -A`.
fn audit_all(vmplane: &Cli) -> Vec<Value> {
    let out = vmplane.ok(&["audit", "-A", "-o", "json"]);
    serde_json::from_str::<Value>(&out)
        .expect("audit JSON")
        .as_array()
        .expect("a list")
        .clone()
}

#[test]
fn apply_and_get_over_tls_with_the_ca_record_the_principal() {
    let pki = Pki::new();
    let auth = pki.dir.path().join("auth.yaml");
    write_auth_file(
        &auth,
        &[AuthToken {
            principal: "ops",
            token: OPS,
            roles: &[("admin", &[])],
        }],
    );
    let mut extra = pki.serve_args();
    extra.extend(["--auth", path_str(&auth)]);
    let server = Server::start(&pki.dir.path().join("data"), &extra);
    assert!(
        server.stderr().contains("ready: serving gRPC on") && server.stderr().contains("over TLS"),
        "the ready line says TLS: {}",
        server.stderr()
    );
    let vmplane = Cli::at(&server.https_url())
        .with_ca_cert(&pki.ca)
        .with_token(OPS);
    let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &example_vm());
    assert_eq!(
        (code, out.as_str()),
        (0, "virtualmachine/demo created\n"),
        "{err}"
    );
    let vm: Value =
        serde_json::from_str(&vmplane.ok(&["get", "vm", "demo", "-o", "json"])).expect("JSON");
    assert_eq!(vm["metadata"]["name"], "demo", "{vm}");
    let history: Value =
        serde_json::from_str(&vmplane.ok(&["history", "vm", "demo", "-o", "json"])).expect("JSON");
    assert_eq!(
        history[0]["actor"], "ops",
        "the principal is the actor: {history}"
    );
    // The certificate names localhost too.
    let port = server.addr.port();
    let by_name = Cli::at(&format!("https://localhost:{port}"))
        .with_ca_cert(&pki.ca)
        .with_token(OPS);
    assert!(by_name.ok(&["get", "vms"]).contains("demo"));
    // And without a token the TLS server still refuses, as a plaintext one would.
    let anonymous = Cli::at(&server.https_url()).with_ca_cert(&pki.ca);
    let line = anonymous.fails(&["get", "vms"]);
    assert!(line.contains("unauthenticated"), "{line}");
}

#[test]
fn https_without_the_ca_fails_naming_the_certificate_and_changes_nothing() {
    let pki = Pki::new();
    let server = Server::start(&pki.dir.path().join("data"), &pki.serve_args());
    let untrusting = Cli::at(&server.https_url());
    let (code, _out, err) = untrusting.run_with_stdin(&["apply", "-f", "-"], &example_vm());
    assert_ne!(code, 0, "an untrusted certificate must fail: {err}");
    let line = vmplane_tests::one_error_line(&err);
    assert!(
        line.contains("TLS handshake failed")
            && line.contains("certificate is not trusted")
            && line.contains("--ca-cert"),
        "names the certificate problem and suggests --ca-cert: {line}"
    );
    // A CA that did not sign the server's certificate: the line names the file given.
    let wrong = Cli::at(&server.https_url()).with_ca_cert(&pki.other_ca);
    let line = wrong.fails(&["get", "vms"]);
    assert!(
        line.contains("not trusted") && line.contains(path_str(&pki.other_ca)),
        "{line}"
    );
    let trusting = Cli::at(&server.https_url()).with_ca_cert(&pki.ca);
    assert_eq!(
        audit_all(&trusting),
        Vec::<Value>::new(),
        "nothing was applied"
    );
}

#[test]
fn https_against_a_plaintext_server_fails_and_never_talks_plaintext() {
    let pki = Pki::new();
    let server = Server::start(&pki.dir.path().join("data"), &[]);
    for vmplane in [
        Cli::at(&server.https_url()),
        Cli::at(&server.https_url()).with_ca_cert(&pki.ca),
    ] {
        let (code, out, err) = vmplane.run_with_stdin(&["apply", "-f", "-"], &example_vm());
        assert_ne!(code, 0, "https against plaintext must fail: {out}");
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains("TLS handshake failed") && line.contains("http://"),
            "says the handshake failed and what to check: {line}"
        );
    }
    let plaintext = Cli::new(&server);
    assert_eq!(
        audit_all(&plaintext),
        Vec::<Value>::new(),
        "nothing was applied"
    );
}

#[test]
fn http_against_a_tls_server_fails_saying_to_use_https() {
    let pki = Pki::new();
    let server = Server::start(&pki.dir.path().join("data"), &pki.serve_args());
    let plaintext = Cli::new(&server);
    for args in [&["get", "vms"][..], &["audit", "-A"], &["start", "demo"]] {
        let line = plaintext.fails(args);
        assert!(
            line.contains("https://") && line.contains("TLS"),
            "{args:?}: suggests https://: {line}"
        );
    }
    // A CA with a plaintext URL is refused rather than ignored.
    let line = plaintext.with_ca_cert(&pki.ca).fails(&["get", "vms"]);
    assert!(
        line.contains("--ca-cert") && line.contains("https://"),
        "{line}"
    );
}

#[test]
fn the_health_service_answers_over_tls() {
    let pki = Pki::new();
    let server = Server::start(&pki.dir.path().join("data"), &pki.serve_args());
    let ca = std::fs::read(&pki.ca).expect("read the CA");
    assert_eq!(
        health_over_tls(&server, &ca, "vmplane.v1.Objects"),
        ServingStatus::Serving
    );
}

/// The health of `service` (the server's, when empty) asked over TLS, trusting `ca`, within 3 s
/// for the connection and 3 s for the answer.
fn health_over_tls(server: &Server, ca: &[u8], service: &str) -> ServingStatus {
    rt().block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca));
        let channel = tonic::transport::Channel::from_shared(server.https_url())
            .expect("url")
            .tls_config(tls)
            .expect("TLS config")
            .connect_timeout(std::time::Duration::from_secs(3))
            .timeout(std::time::Duration::from_secs(3))
            .connect()
            .await
            .expect("connect over TLS");
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status()
    })
}

/// Connections that open and say nothing (a port scanner, a stalled client) wait for their
/// handshake in tasks of their own: a client arriving behind them is served at once, not after
/// their 10-second deadline, and the server keeps serving once they give up.
#[test]
fn silent_connections_do_not_hold_up_the_handshake_of_the_next_client() {
    let pki = Pki::new();
    let server = Server::start(&pki.dir.path().join("data"), &pki.serve_args());
    let ca = std::fs::read(&pki.ca).expect("read the CA");
    let silent: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(server.addr).expect("connect a silent client"))
        .collect();
    let started = std::time::Instant::now();
    assert_eq!(health_over_tls(&server, &ca, ""), ServingStatus::Serving);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "served after {:?}, behind the silent connections",
        started.elapsed()
    );
    drop(silent);
    assert_eq!(health_over_tls(&server, &ca, ""), ServingStatus::Serving);
}

#[test]
fn serve_refuses_a_certificate_without_its_key_naming_tls_key() {
    let pki = Pki::new();
    let data = pki.dir.path().join("data");
    for (given, missing) in [
        (["--tls-cert", path_str(&pki.cert)], "--tls-key"),
        (["--tls-key", path_str(&pki.key)], "--tls-cert"),
    ] {
        let mut args = vec![
            "serve",
            "--data",
            path_str(&data),
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend(given);
        let (code, _out, err) = run_cli(&args);
        assert_ne!(code, 0, "{given:?} alone must be refused");
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains(&format!("{missing} is missing")),
            "names {missing}: {line}"
        );
        assert!(
            !data.exists(),
            "a refused start must not create the data dir"
        );
    }
}

#[test]
fn serve_refuses_a_garbage_key_or_certificate_naming_the_flag_and_path() {
    let pki = Pki::new();
    let data = pki.dir.path().join("data");
    let garbage = pki.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "this is not a key\n").expect("write");
    let missing = pki.dir.path().join("nowhere.pem");
    let cases = [
        (
            &pki.cert,
            &garbage,
            "--tls-key",
            &garbage,
            "no PEM private key",
        ),
        (
            &garbage,
            &pki.key,
            "--tls-cert",
            &garbage,
            "no PEM certificate",
        ),
        (&pki.cert, &missing, "--tls-key", &missing, "cannot read"),
        // A real key, but not the certificate's (the CA's certificate is not the server's).
        (
            &pki.ca,
            &pki.key,
            "--tls-key",
            &pki.key,
            "not the private key",
        ),
    ];
    for (cert, key, flag, path, reason) in cases {
        let (code, _out, err) = run_cli(&[
            "serve",
            "--data",
            path_str(&data),
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            path_str(cert),
            "--tls-key",
            path_str(key),
        ]);
        assert_ne!(code, 0, "{flag} {} must be refused", path.display());
        let line = vmplane_tests::one_error_line(&err);
        assert!(
            line.contains(&format!("{flag} {}", path.display())) && line.contains(reason),
            "names {flag}, {} and the reason ({reason}): {line}",
            path.display()
        );
        assert!(
            !data.exists(),
            "a refused start must not create the data dir"
        );
    }
}
