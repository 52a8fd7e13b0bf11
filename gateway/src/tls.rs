//! TLS at the edge: the server's certificate and key (`serve --tls-cert/--tls-key`), the CA a
//! client verifies an `https://` server against (`--ca-cert`), and one clear line for a
//! handshake that failed.
//!
//! Reading order: [`ServerTls::load`] (both files or neither, each read and parsed here so a
//! bad file is refused at startup naming its flag and path), [`client_endpoint`] (the scheme
//! decides: `https://` is TLS and never falls back to plaintext, `http://` is plaintext),
//! [`connect`] and [`explain_connect_failure`] (why a handshake failed, and what to check; a
//! plaintext call a TLS server hung up on says so too).
//!
//! [`certificate_warnings`] says, at startup, what about a certificate that loads makes every
//! client refuse it (expired, not valid yet, a CA's, not for servers): `serve` warns.
//!
//! rustls with the `ring` provider does the work: through tonic on the client, through
//! tokio-rustls in the server's listener (`connections::serve`); rustls-webpki, rustls' own
//! certificate checker, reads the certificate for the warnings. This module never relaxes a
//! verification (no "insecure" switch) and never reads a file the user did not name: without
//! `--ca-cert` a client trusts the webpki roots compiled into the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// How long a TLS handshake may take, in milliseconds, on either side: a peer that opens a
/// connection and says nothing does not hold it longer.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// A TLS file (or pair of flags) that cannot be used. Each names the flag and, for a file, its
/// path and the reason.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// `--tls-cert` without `--tls-key`.
    #[error(
        "--tls-cert {}: --tls-key is missing (TLS needs both the certificate and its private key, \
         or neither for plaintext)",
        cert.display()
    )]
    MissingKey { cert: PathBuf },
    /// `--tls-key` without `--tls-cert`.
    #[error(
        "--tls-key {}: --tls-cert is missing (TLS needs both the certificate and its private key, \
         or neither for plaintext)",
        key.display()
    )]
    MissingCert { key: PathBuf },
    /// The file cannot be read.
    #[error("{flag} {}: cannot read: {error}", path.display())]
    Unreadable {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file was read but does not hold what the flag needs.
    #[error("{flag} {}: {reason}", path.display())]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
}

/// The server's TLS identity: a certificate chain and its private key, checked to belong
/// together, and what about the certificate makes clients refuse it.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    cert: PathBuf,
    warnings: Vec<CertificateWarning>,
}

/// Something about the server's certificate that makes every client refuse it, though the
/// server can present it: `serve` starts, and warns (the certificate may be renewed in place, or
/// the clock be wrong).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateWarning {
    /// Its validity ended at `not_after`.
    Expired { not_after: UnixTime },
    /// Its validity starts at `not_before`, after now.
    NotValidYet { not_before: UnixTime },
    /// A CA certificate (basic constraints `CA:TRUE`), which clients refuse as a server's own.
    Ca,
    /// Its extended key usage leaves out TLS server authentication.
    NotForServers,
}

impl std::fmt::Display for CertificateWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertificateWarning::Expired { not_after } => write!(
                f,
                "the certificate expired on {}: every client will refuse it (renew it, or check \
                 this machine's clock)",
                utc(*not_after)
            ),
            CertificateWarning::NotValidYet { not_before } => write!(
                f,
                "the certificate is not valid until {}: every client will refuse it until then \
                 (check this machine's clock)",
                utc(*not_before)
            ),
            CertificateWarning::Ca => f.write_str(
                "the certificate is a CA certificate (basic constraints CA:TRUE): every client \
                 will refuse it as a server's own (present a certificate that CA signed, for \
                 this server's names)",
            ),
            CertificateWarning::NotForServers => f.write_str(
                "the certificate's extended key usage leaves out TLS server authentication \
                 (serverAuth): every client will refuse it (issue one for a server)",
            ),
        }
    }
}

/// `time` as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(time: UnixTime) -> String {
    i64::try_from(time.as_secs())
        .ok()
        .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
        .map_or_else(
            || format!("{} s after 1970", time.as_secs()),
            |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        )
}

/// What makes clients refuse `leaf` as a server's certificate at `now`, whoever signed it: the
/// checks rustls-webpki makes of a certificate before it looks for its issuer (validity, basic
/// constraints, extended key usage), asked with no issuer to find. Each check is asked again at
/// a time inside the validity, so that an expired CA certificate is said to be both. Empty when
/// `leaf` cannot be parsed (rustls accepted it to load, so it can).
pub fn certificate_warnings(leaf: &CertificateDer<'_>, now: UnixTime) -> Vec<CertificateWarning> {
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return Vec::new();
    };
    let algorithms = rustls::crypto::ring::default_provider()
        .signature_verification_algorithms
        .all;
    let mut warnings = Vec::new();
    let mut at = now;
    // Validity first, then the rest: at most one retry inside the validity.
    for _ in 0..2 {
        let checked = cert.verify_for_usage(
            algorithms,
            &[],
            &[],
            at,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        );
        match checked {
            Err(webpki::Error::CertExpired { not_after, .. }) => {
                warnings.push(CertificateWarning::Expired { not_after });
                at = not_after;
            }
            Err(webpki::Error::CertNotValidYet { not_before, .. }) => {
                warnings.push(CertificateWarning::NotValidYet { not_before });
                at = not_before;
            }
            Err(webpki::Error::CaUsedAsEndEntity) => {
                warnings.push(CertificateWarning::Ca);
                break;
            }
            #[allow(deprecated)]
            Err(
                webpki::Error::RequiredEkuNotFound | webpki::Error::RequiredEkuNotFoundContext(_),
            ) => {
                warnings.push(CertificateWarning::NotForServers);
                break;
            }
            // `UnknownIssuer`: every check that needs no issuer passed.
            _ => break,
        }
    }
    warnings
}

impl ServerTls {
    /// `None` when neither flag is given (plaintext); the identity when both are, read and
    /// checked now: PEM certificates, a PEM private key rustls can sign with, and the key the
    /// first certificate names.
    pub fn load(
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<ServerTls>, TlsFileError> {
        let (cert, key) = match (cert, key) {
            (None, None) => return Ok(None),
            (Some(cert), None) => {
                return Err(TlsFileError::MissingKey {
                    cert: cert.to_path_buf(),
                });
            }
            (None, Some(key)) => {
                return Err(TlsFileError::MissingCert {
                    key: key.to_path_buf(),
                });
            }
            (Some(cert), Some(key)) => (cert, key),
        };
        let cert_pem = read("--tls-cert", cert)?;
        let chain = certificates("--tls-cert", cert, &cert_pem)?;
        let warnings = chain
            .first()
            .map(|leaf| certificate_warnings(leaf, UnixTime::now()))
            .unwrap_or_default();
        let key_pem = read("--tls-key", key)?;
        let private_key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| {
            invalid(
                "--tls-key",
                key,
                match err {
                    pem::Error::NoItemsFound => "no PEM private key found (expected a \
                                                 `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE \
                                                 KEY` block)"
                        .to_string(),
                    other => pem_reason(other),
                },
            )
        })?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = rustls::sign::CertifiedKey::from_der(chain, private_key, &provider)
            .map_err(|err| match err {
                rustls::Error::InconsistentKeys(_) => invalid(
                    "--tls-key",
                    key,
                    format!(
                        "is not the private key of the certificate in --tls-cert {}",
                        cert.display()
                    ),
                ),
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                    invalid(
                        "--tls-cert",
                        cert,
                        format!("not a usable certificate: {err}"),
                    )
                }
                other => invalid(
                    "--tls-key",
                    key,
                    format!(
                        "not a usable private key (RSA, ECDSA P-256/P-384 or Ed25519): {other}"
                    ),
                ),
            })?;
        // Serves the key and certificate checked just above: what is left to fail here is
        // rustls' own choice of protocol versions for the provider.
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .map_err(|err| invalid("--tls-key", key, format!("cannot serve TLS with it: {err}")))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
        // HTTP/2 only, offered through ALPN, as gRPC clients ask for it.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(ServerTls {
            config: Arc::new(config),
            cert: cert.to_path_buf(),
            warnings,
        }))
    }

    /// The handshake side of this identity, for the server's listener (`connections::serve`,
    /// which gives a handshake `serve --connection-open-timeout-ms`).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// What about the certificate makes clients refuse it, as found when it was loaded.
    pub fn warnings(&self) -> &[CertificateWarning] {
        &self.warnings
    }

    /// The `--tls-cert` file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }
}

/// The endpoint a client connects to: `https://` with TLS, verified against `ca_cert` when
/// given, else the webpki roots; `http://` in plaintext (and a `ca_cert` then refused: the user
/// asked for verification a plaintext connection cannot give).
pub fn client_endpoint(server: &str, ca_cert: Option<&Path>) -> anyhow::Result<Endpoint> {
    let endpoint = Endpoint::from_shared(with_scheme(server, ca_cert))
        .map_err(|e| anyhow::anyhow!("--server {server}: not a valid URL: {e}"))?;
    let https = match endpoint.uri().scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => anyhow::bail!(
            "--server {server}: the scheme {:?} is neither http:// (plaintext) nor https:// \
             (TLS)",
            other.unwrap_or_default()
        ),
    };
    if !https {
        if let Some(ca) = ca_cert {
            anyhow::bail!(
                "--ca-cert {}: --server {server} is plaintext, so there is no certificate to \
                 verify; use https:// to connect with TLS",
                ca.display()
            );
        }
        return Ok(endpoint);
    }
    let tls = ClientTlsConfig::new().timeout(Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS));
    let tls = match ca_cert {
        Some(path) => {
            let pem = read("--ca-cert", path)?;
            certificates("--ca-cert", path, &pem)?;
            tls.ca_certificate(Certificate::from_pem(pem))
        }
        None => tls.with_webpki_roots(),
    };
    endpoint
        .tls_config(tls)
        .map_err(|e| anyhow::anyhow!("--server {server}: cannot set up TLS: {e}"))
}

/// `server` as a URL: a bare `HOST:PORT` (what the server's ready line prints) gets the scheme
/// kubectl would give it, `https://` when a CA to verify it is given, else `http://`.
fn with_scheme(server: &str, ca_cert: Option<&Path>) -> String {
    if server.contains("://") {
        server.to_string()
    } else if ca_cert.is_some() {
        format!("https://{server}")
    } else {
        format!("http://{server}")
    }
}

/// What a failed call on a [`ClientChannel`] reports to tonic, which finds a `Status` in it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connected channel whose failures on a plaintext connection say when a TLS server is the
/// likely cause (see `plaintext_call_failure`).
pub type ClientChannel = tower::util::MapErr<Channel, fn(tonic::transport::Error) -> BoxError>;

/// Connects `endpoint` (from [`client_endpoint`]); a failure becomes one line that says what
/// failed (the TLS handshake and why, or the connection) and what to check.
pub async fn connect(
    endpoint: Endpoint,
    server: &str,
    ca_cert: Option<&Path>,
) -> anyhow::Result<ClientChannel> {
    let https = endpoint.uri().scheme_str() == Some("https");
    let channel = endpoint
        .connect()
        .await
        .map_err(|err| explain_connect_failure(&err, server, ca_cert))?;
    let explain: fn(tonic::transport::Error) -> BoxError = if https {
        passed_on
    } else {
        plaintext_call_failure
    };
    Ok(tower::util::MapErr::new(channel, explain))
}

/// Why connecting to `server` failed, as one line: a TLS handshake's failure says so, names the
/// certificate problem, and suggests `--ca-cert` or the scheme to check; anything else is the
/// server not being reachable.
pub fn explain_connect_failure(
    err: &(dyn std::error::Error + 'static),
    server: &str,
    ca_cert: Option<&Path>,
) -> anyhow::Error {
    let https = server
        .parse::<http::Uri>()
        .is_ok_and(|uri| uri.scheme_str() == Some("https"));
    if let Some(tls) = rustls_error(err) {
        return anyhow::anyhow!("--server {server}: {}", handshake_failure(tls, ca_cert));
    }
    if https && connection_dropped(err) {
        return anyhow::anyhow!(
            "--server {server}: TLS handshake failed: the server closed the connection ({}); is \
             it serving TLS? A server started without --tls-cert speaks plaintext (http://); \
             check the host, the port and the scheme",
            innermost(err)
        );
    }
    anyhow::anyhow!(
        "cannot reach the vmplane server at {server}: {} (is `vmplane serve` running? set \
         --server or VMPLANE_SERVER)",
        innermost(err)
    )
}

/// A plaintext (`http://`) call that failed because the server hung up on it, or answered
/// with what HTTP/2 cannot read (a TLS alert read as a frame far larger than allowed): the
/// failure becomes an `Unavailable` status that says so and suggests `https://`, since that is
/// what a TLS server does with plaintext. Every other failure is passed on as it is.
fn plaintext_call_failure(err: tonic::transport::Error) -> BoxError {
    let closed = connection_dropped(&err);
    if closed || chain_text(&err).contains("frame with invalid size") {
        let what = if closed {
            "the server closed the connection"
        } else {
            "the server did not answer in plaintext HTTP/2"
        };
        return Box::new(tonic::Status::unavailable(format!(
            "{what} ({}); if it serves TLS (started with --tls-cert), connect with --server \
             https://HOST:PORT (and --ca-cert for its CA)",
            innermost(&err)
        )));
    }
    Box::new(err)
}

fn passed_on(err: tonic::transport::Error) -> BoxError {
    Box::new(err)
}

fn handshake_failure(err: &rustls::Error, ca_cert: Option<&Path>) -> String {
    use rustls::CertificateError as C;
    let trust = match ca_cert {
        Some(ca) => format!(
            "it is not signed by the CA in --ca-cert {}; pass the CA that signed the server's \
             certificate",
            ca.display()
        ),
        None => "it is not signed by a CA this client trusts; pass the CA that signed it with \
                 --ca-cert FILE (or VMPLANE_CA_CERT)"
            .to_string(),
    };
    match err {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer => {
                format!("TLS handshake failed: the server's certificate is not trusted: {trust}")
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => format!(
                "TLS handshake failed: the server's certificate is not valid for this host \
                 ({err}); connect with a name or address the certificate lists"
            ),
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => {
                format!(
                    "TLS handshake failed: the server's certificate is outside its validity \
                     period ({err}); renew it, or check this machine's clock"
                )
            }
            _ => format!("TLS handshake failed: the server's certificate was refused ({err})"),
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::PeerMisbehaved(_) => format!(
            "TLS handshake failed: the server did not answer in TLS ({err}); is it serving TLS? \
             A server started without --tls-cert speaks plaintext (http://)"
        ),
        other => format!("TLS handshake failed: {other}"),
    }
}

/// The rustls error somewhere in `err`'s chain (tokio-rustls hands it over inside an
/// `io::Error`, whose `source` skips it).
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        next = e.source();
    }
    None
}

/// Whether the peer hung up: what a plaintext server does with a TLS hello.
fn connection_dropped(err: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted
            )
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The innermost error's text (tonic's outer layers say only "transport error").
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

fn chain_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        parts.push(e.to_string());
        next = e.source();
    }
    parts.join(": ")
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|error| TlsFileError::Unreadable {
        flag,
        path: path.to_path_buf(),
        error,
    })
}

/// Every PEM certificate in `pem`; at least one.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(flag, path, pem_reason(err)))?;
    if certs.is_empty() {
        return Err(invalid(
            flag,
            path,
            "no PEM certificate found (expected a `CERTIFICATE` block)".to_string(),
        ));
    }
    Ok(certs)
}

fn pem_reason(err: pem::Error) -> String {
    match err {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "not valid PEM: a section has no `{}` line",
            String::from_utf8_lossy(&end_marker)
        ),
        pem::Error::IllegalSectionStart { .. } => {
            "not valid PEM: a section's `-----BEGIN` line is malformed".to_string()
        }
        pem::Error::Base64Decode(e) => format!("not valid PEM: bad base64 ({e})"),
        pem::Error::NoItemsFound => "no PEM item found".to_string(),
        pem::Error::SectionTooLarge => "not valid PEM: a section is too large".to_string(),
        other => format!("not valid PEM: {other}"),
    }
}

fn invalid(flag: &'static str, path: &Path, reason: String) -> TlsFileError {
    TlsFileError::Invalid {
        flag,
        path: path.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_without_a_key_is_refused_naming_tls_key() {
        let err = ServerTls::load(Some(Path::new("cert.pem")), None).expect_err("refused");
        assert!(err.to_string().contains("--tls-key is missing"), "{err}");
        let err = ServerTls::load(None, Some(Path::new("key.pem"))).expect_err("refused");
        assert!(err.to_string().contains("--tls-cert is missing"), "{err}");
        assert!(ServerTls::load(None, None).expect("plaintext").is_none());
    }

    #[test]
    fn a_ca_cert_with_a_plaintext_server_is_refused() {
        let err =
            client_endpoint("http://127.0.0.1:1", Some(Path::new("ca.pem"))).expect_err("refused");
        assert!(err.to_string().contains("--ca-cert ca.pem"), "{err}");
        assert!(client_endpoint("http://127.0.0.1:1", None).is_ok());
    }

    #[test]
    fn a_scheme_other_than_http_or_https_is_refused_naming_it() {
        for server in ["ftp://127.0.0.1:1", "grpc://127.0.0.1:1"] {
            let err = client_endpoint(server, None).expect_err("refused");
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("--server {server}: the scheme")),
                "{text}"
            );
        }
        assert!(client_endpoint("https://127.0.0.1:1", None).is_ok());
    }

    #[test]
    fn a_bare_host_and_port_gets_the_scheme_kubectl_would_give_it() {
        let plain = client_endpoint("127.0.0.1:1", None).expect("plaintext");
        assert_eq!(plain.uri().scheme_str(), Some("http"));
        assert_eq!(
            plain.uri().authority().map(|a| a.as_str()),
            Some("127.0.0.1:1")
        );
        assert_eq!(
            with_scheme("localhost:1", Some(Path::new("ca.pem"))),
            "https://localhost:1"
        );
        assert_eq!(with_scheme("https://h:1", None), "https://h:1");
    }

    /// A certificate for localhost signed by a throwaway CA, made by `edit` from the defaults.
    fn certificate(edit: impl FnOnce(&mut rcgen::CertificateParams)) -> CertificateDer<'static> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = Issuer::new(ca_params, KeyPair::generate().expect("CA key"));
        let mut params = CertificateParams::new(vec!["localhost".into()]).expect("params");
        edit(&mut params);
        params
            .signed_by(&KeyPair::generate().expect("key"), &issuer)
            .expect("certificate")
            .der()
            .clone()
    }

    fn at(year: i32) -> UnixTime {
        let secs = rcgen::date_time_ymd(year, 1, 1).unix_timestamp();
        UnixTime::since_unix_epoch(Duration::from_secs(
            u64::try_from(secs).expect("after 1970"),
        ))
    }

    #[test]
    fn a_certificate_clients_refuse_is_named_at_startup_and_a_good_one_is_not() {
        use rcgen::{BasicConstraints, ExtendedKeyUsagePurpose, IsCa, date_time_ymd};
        let now = UnixTime::now();
        assert_eq!(certificate_warnings(&certificate(|_| {}), now), []);
        let dated = |from: i32, to: i32| {
            certificate(|p| {
                p.not_before = date_time_ymd(from, 1, 1);
                p.not_after = date_time_ymd(to, 1, 1);
            })
        };
        assert_eq!(
            certificate_warnings(&dated(2000, 2001), now),
            [CertificateWarning::Expired {
                not_after: at(2001)
            }]
        );
        assert_eq!(
            certificate_warnings(&dated(2000, 2001), at(2000)),
            [],
            "valid then"
        );
        assert_eq!(
            certificate_warnings(&dated(2090, 2091), now),
            [CertificateWarning::NotValidYet {
                not_before: at(2090)
            }]
        );
        let ca =
            |p: &mut rcgen::CertificateParams| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        assert_eq!(
            certificate_warnings(&certificate(ca), now),
            [CertificateWarning::Ca]
        );
        let expired_ca = certificate(|p| {
            ca(p);
            p.not_before = date_time_ymd(2000, 1, 1);
            p.not_after = date_time_ymd(2001, 1, 1);
        });
        assert_eq!(
            certificate_warnings(&expired_ca, now),
            [
                CertificateWarning::Expired {
                    not_after: at(2001)
                },
                CertificateWarning::Ca
            ]
        );
        let for_clients =
            certificate(|p| p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth]);
        assert_eq!(
            certificate_warnings(&for_clients, now),
            [CertificateWarning::NotForServers]
        );
        let text = CertificateWarning::Expired {
            not_after: at(2001),
        }
        .to_string();
        assert!(
            text.starts_with("the certificate expired on 2001-01-01 00:00:00 UTC: "),
            "{text}"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").expect("write");
        let err = client_endpoint("https://127.0.0.1:1", Some(&path)).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("--ca-cert") && text.contains("ca.pem"),
            "{text}"
        );
        assert!(text.contains("no PEM certificate"), "{text}");
    }
}
