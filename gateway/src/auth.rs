//! Authentication and authorization.
//!
//! `--auth FILE` (YAML) lists tokens, stored as SHA-256 hex digests, never in the clear, each
//! with a principal and roles:
//!
//! ```yaml
//! tokens:
//!   - principal: alice
//!     sha256: 2bd806c9...        # sha256 of the token alice sends
//!     roles:
//!       - {role: edit, namespaces: [team-a]}
//!       - {role: view, namespaces: [shared]}
//!   - principal: ops
//!     sha256: 9f86d081...
//!     roles: [{role: admin}]
//! ```
//!
//! A request carries its token as `authorization: Bearer <token>` (the scheme in any case, as
//! RFC 7235 has it). Principals `local` and `system:*` are refused: they are vmplane's own
//! actors (see [`Authenticator::parse`]). The token is hashed and the
//! digest compared with every entry in constant time. Without `--auth` every request acts as
//! principal `local` with the admin role (and the server only listens on loopback).
//!
//! Roles: `admin` — everything, including the cluster config, cluster-scoped
//! instancetypes/preferences and the admin commands; `edit` — read and change objects of the
//! listed namespaces; `view` — read them (history, audit, watch and time travel included).
//! Cluster-scoped objects (cluster instancetypes and preferences, the cluster config) can be
//! read by every authenticated principal and changed only by an admin.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Largest `--auth` file read, in bytes.
pub const AUTH_FILE_BYTES_MAX: u64 = 1 << 20;

/// A role granted to a principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Read and change objects in these namespaces.
    Edit(Vec<String>),
    /// Read objects in these namespaces.
    View(Vec<String>),
}

/// Who is asking, and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Recorded as the actor of every event this principal causes.
    pub name: String,
    /// What it may do.
    pub roles: Vec<Role>,
}

/// What a request wants to do to a namespace (or, with `None`, to the cluster scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read objects, history, audit, watch, time travel.
    Read,
    /// Create, change, delete, start/stop.
    Write,
    /// Admin-only operations (backup, verify, cluster configuration changes).
    Admin,
}

impl Principal {
    /// The principal of a server started without `--auth`.
    pub fn local() -> Principal {
        Principal {
            name: "local".into(),
            roles: vec![Role::Admin],
        }
    }

    /// Whether this principal has the admin role.
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| matches!(r, Role::Admin))
    }

    /// May this principal perform `access` on `namespace` (`None`: a cluster-scoped object)?
    pub fn may(&self, access: Access, namespace: Option<&str>) -> bool {
        if self.is_admin() {
            return true;
        }
        match (access, namespace) {
            (Access::Admin, _) => false,
            // Cluster-scoped objects: readable by every authenticated principal.
            (Access::Read, None) => true,
            (Access::Write, None) => false,
            (Access::Read, Some(ns)) => self.roles.iter().any(|r| match r {
                Role::Edit(nss) | Role::View(nss) => nss.iter().any(|n| n == ns),
                Role::Admin => true,
            }),
            (Access::Write, Some(ns)) => self.roles.iter().any(|r| match r {
                Role::Edit(nss) => nss.iter().any(|n| n == ns),
                Role::View(_) => false,
                Role::Admin => true,
            }),
        }
    }

    /// The namespaces this principal may read, or `None` when it may read every namespace.
    pub fn readable_namespaces(&self) -> Option<Vec<String>> {
        if self.is_admin() {
            return None;
        }
        let mut out: Vec<String> = self
            .roles
            .iter()
            .flat_map(|r| match r {
                Role::Edit(nss) | Role::View(nss) => nss.clone(),
                Role::Admin => Vec::new(),
            })
            .collect();
        out.sort();
        out.dedup();
        Some(out)
    }
}

/// Why an `--auth` file was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// The file could not be read.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error: in the message, not a `source` (thiserror makes a field named
        /// `source` one), since the binary prints an error's whole chain, which would say the
        /// cause twice.
        error: std::io::Error,
    },
    /// The file is larger than [`AUTH_FILE_BYTES_MAX`].
    #[error("{path} is {bytes} bytes, more than the {max} bytes allowed")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The YAML does not have the expected shape.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, with the field path.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    principal: String,
    sha256: String,
    #[serde(default)]
    roles: Vec<RoleEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleEntry {
    role: String,
    #[serde(default)]
    namespaces: Vec<String>,
}

/// Why `name` may not be a principal of an `--auth` file, if it may not: the actors vmplane
/// records for itself, which a token must not impersonate in the audit (compared without case
/// or surrounding spaces, so no look-alike passes either).
fn reserved_principal(name: &str) -> Option<&'static str> {
    let name = name.trim().to_ascii_lowercase();
    if name == "local" {
        Some("it is the actor of every request to a server without --auth")
    } else if name.starts_with("system:") {
        Some("names starting with system: are vmplane's own actors (system:reconciler)")
    } else {
        None
    }
}

/// The token of an `authorization` header value: `Bearer <token>`, the scheme in any case
/// (RFC 7235: auth schemes are case-insensitive), spaces around the token ignored.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The tokens a server accepts.
#[derive(Debug, Clone)]
pub struct Authenticator {
    entries: Vec<([u8; 32], Principal)>,
}

/// The SHA-256 hex digest of a token, as written in an `--auth` file.
pub fn token_digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// What `roles` grant, whatever their order or repetition: equal for two lists that allow the
/// same.
fn grants(roles: &[Role]) -> std::collections::BTreeSet<(u8, &str)> {
    roles
        .iter()
        .flat_map(|r| -> Box<dyn Iterator<Item = (u8, &str)> + '_> {
            match r {
                Role::Admin => Box::new(std::iter::once((0, ""))),
                Role::Edit(nss) => Box::new(nss.iter().map(|n| (1, n.as_str()))),
                Role::View(nss) => Box::new(nss.iter().map(|n| (2, n.as_str()))),
            }
        })
        .collect()
}

impl Authenticator {
    /// Reads and checks an `--auth` file.
    pub fn load(path: &Path) -> Result<Authenticator, AuthFileError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|error| AuthFileError::Io {
            path: shown.clone(),
            error,
        })?;
        if meta.len() > AUTH_FILE_BYTES_MAX {
            return Err(AuthFileError::TooLarge {
                path: shown,
                bytes: meta.len(),
                max: AUTH_FILE_BYTES_MAX,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|error| AuthFileError::Io {
            path: shown.clone(),
            error,
        })?;
        Authenticator::parse(&text).map_err(|reason| AuthFileError::Invalid {
            path: shown,
            reason,
        })
    }

    /// Parses the YAML of an `--auth` file; the error names the field.
    pub fn parse(text: &str) -> Result<Authenticator, String> {
        let file: AuthFile = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        if file.tokens.is_empty() {
            return Err("tokens: at least one token is required".into());
        }
        let mut entries = Vec::with_capacity(file.tokens.len());
        for (i, t) in file.tokens.into_iter().enumerate() {
            let at = format!("tokens[{i}]");
            if t.principal.trim().is_empty() {
                return Err(format!("{at}.principal: must not be empty"));
            }
            if let Some(why) = reserved_principal(&t.principal) {
                return Err(format!(
                    "{at}.principal: {:?} is reserved: {why}; choose another name",
                    t.principal
                ));
            }
            let mut digest = [0u8; 32];
            hex::decode_to_slice(t.sha256.trim(), &mut digest).map_err(|_| {
                format!("{at}.sha256: must be 64 hex digits (the SHA-256 of the token)")
            })?;
            if entries
                .iter()
                .any(|(d, _): &([u8; 32], Principal)| *d == digest)
            {
                return Err(format!(
                    "{at}.sha256: the same token digest is listed twice"
                ));
            }
            let mut roles = Vec::new();
            for (j, r) in t.roles.into_iter().enumerate() {
                let rat = format!("{at}.roles[{j}]");
                let role = match r.role.as_str() {
                    "admin" => {
                        if !r.namespaces.is_empty() {
                            return Err(format!(
                                "{rat}.namespaces: admin applies to every namespace; remove the list"
                            ));
                        }
                        Role::Admin
                    }
                    "edit" | "view" => {
                        if r.namespaces.is_empty() {
                            return Err(format!(
                                "{rat}.namespaces: role {} needs at least one namespace",
                                r.role
                            ));
                        }
                        for (k, ns) in r.namespaces.iter().enumerate() {
                            if let Some(why) = vmplane_core::validate::namespace_problem(ns) {
                                let hint = if ns == "*" {
                                    "; there is no wildcard: list each namespace, or give \
                                     role admin"
                                } else {
                                    ""
                                };
                                return Err(format!(
                                    "{rat}.namespaces[{k}]: {}: {why}{hint}",
                                    vmplane_core::validate::shown(ns)
                                ));
                            }
                        }
                        if r.role == "edit" {
                            Role::Edit(r.namespaces)
                        } else {
                            Role::View(r.namespaces)
                        }
                    }
                    other => {
                        return Err(format!(
                            "{rat}.role: unknown role {other:?}; expected admin, edit or view"
                        ));
                    }
                };
                roles.push(role);
            }
            // One name, one set of roles: the audit records the principal, not the token. Two
            // tokens of one principal (a rotation) are fine with the same roles.
            if let Some(j) = entries
                .iter()
                .position(|(_, p)| p.name == t.principal && grants(&p.roles) != grants(&roles))
            {
                return Err(format!(
                    "{at}.roles: principal {:?} is also listed at tokens[{j}] with other roles; \
                     the audit records the principal, not the token, so every token of one \
                     principal must carry the same roles (or give each its own name)",
                    t.principal
                ));
            }
            entries.push((
                digest,
                Principal {
                    name: t.principal,
                    roles,
                },
            ));
        }
        Ok(Authenticator { entries })
    }

    /// The principal a bearer token belongs to. Every entry is compared, each in constant time,
    /// so the time taken does not depend on which entry (if any) matched.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<&Principal> = None;
        for (d, principal) in &self.entries {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(principal);
            }
        }
        found.cloned()
    }
}

/// The principal of a request: from its `authorization: Bearer <token>` entry when the server
/// has an authenticator, else `local` (admin). Records it on the request's tracing span.
pub fn principal_of(
    auth: Option<&Authenticator>,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Principal, tonic::Status> {
    let principal = match auth {
        None => Principal::local(),
        Some(auth) => {
            let token = metadata
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
                .ok_or_else(|| {
                    tonic::Status::unauthenticated(
                        "no bearer token: send the metadata `authorization: Bearer TOKEN` \
                         (vmplane: pass --token or VMPLANE_TOKEN)",
                    )
                })?;
            auth.authenticate(token)
                .ok_or_else(|| tonic::Status::unauthenticated("the bearer token is not valid"))?
        }
    };
    tracing::Span::current().record("principal", principal.name.as_str());
    Ok(principal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Authenticator {
        let text = format!(
            "tokens:\n  - principal: alice\n    sha256: {}\n    roles:\n      - {{role: edit, namespaces: [team-a]}}\n      - {{role: view, namespaces: [shared]}}\n  - principal: ops\n    sha256: {}\n    roles: [{{role: admin}}]\n",
            token_digest_hex("alice-token"),
            token_digest_hex("ops-token")
        );
        Authenticator::parse(&text).expect("valid auth file")
    }

    #[test]
    fn a_known_token_authenticates_as_its_principal() {
        let a = auth();
        assert_eq!(
            a.authenticate("alice-token").map(|p| p.name),
            Some("alice".into())
        );
        assert_eq!(
            a.authenticate("ops-token").map(|p| p.name),
            Some("ops".into())
        );
    }

    #[test]
    fn an_unknown_token_does_not_authenticate() {
        assert_eq!(auth().authenticate("alice-token "), None);
        assert_eq!(auth().authenticate(""), None);
    }

    #[test]
    fn edit_reads_and_writes_its_namespaces_only() {
        let alice = auth().authenticate("alice-token").expect("alice");
        assert!(alice.may(Access::Write, Some("team-a")));
        assert!(alice.may(Access::Read, Some("team-a")));
        assert!(alice.may(Access::Read, Some("shared")));
        assert!(
            !alice.may(Access::Write, Some("shared")),
            "view does not write"
        );
        assert!(!alice.may(Access::Read, Some("team-b")));
        assert!(
            !alice.may(Access::Write, None),
            "cluster scope is admin-only to change"
        );
        assert!(alice.may(Access::Read, None), "cluster scope is readable");
        assert!(!alice.may(Access::Admin, None));
        assert_eq!(
            alice.readable_namespaces(),
            Some(vec!["shared".into(), "team-a".into()])
        );
    }

    #[test]
    fn admin_may_do_everything() {
        let ops = auth().authenticate("ops-token").expect("ops");
        for access in [Access::Read, Access::Write, Access::Admin] {
            assert!(ops.may(access, Some("anything")));
            assert!(ops.may(access, None));
        }
        assert_eq!(ops.readable_namespaces(), None);
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in ["Bearer t", "bearer t", "BEARER t", "bEaReR  t "] {
            assert_eq!(bearer_token(value), Some("t"), "{value:?}");
        }
        for value in ["Basic t", "Bearer", "Bearer ", "Bearert", "t"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }

    #[test]
    fn reserved_principals_are_refused_naming_the_field() {
        for name in ["local", "system:reconciler", "System:anything", " LOCAL "] {
            let text = format!(
                "tokens:\n  - principal: ops\n    sha256: {}\n    roles: [{{role: admin}}]\n  - principal: {name:?}\n    sha256: {}\n    roles: [{{role: admin}}]\n",
                token_digest_hex("a"),
                token_digest_hex("b")
            );
            let err = Authenticator::parse(&text).expect_err(name);
            assert!(
                err.starts_with("tokens[1].principal: ") && err.contains("reserved"),
                "{err}"
            );
        }
        assert!(reserved_principal("localhost").is_none());
        assert!(reserved_principal("systems").is_none());
    }

    #[test]
    fn auth_file_errors_name_the_field() {
        let bad_digest = "tokens:\n  - principal: a\n    sha256: xyz\n    roles: [{role: admin}]\n";
        let err = Authenticator::parse(bad_digest).expect_err("bad digest");
        assert!(err.contains("tokens[0].sha256"), "{err}");
        let bad_role = format!(
            "tokens:\n  - principal: a\n    sha256: {}\n    roles: [{{role: root}}]\n",
            token_digest_hex("t")
        );
        let err = Authenticator::parse(&bad_role).expect_err("bad role");
        assert!(
            err.contains("tokens[0].roles[0].role") && err.contains("root"),
            "{err}"
        );
        let no_ns = format!(
            "tokens:\n  - principal: a\n    sha256: {}\n    roles: [{{role: edit}}]\n",
            token_digest_hex("t")
        );
        let err = Authenticator::parse(&no_ns).expect_err("edit without namespaces");
        assert!(err.contains("tokens[0].roles[0].namespaces"), "{err}");
        for (namespace, shown) in [("'*'", "\"*\""), ("''", "\"\""), ("Team-A", "\"Team-A\"")] {
            let bad = format!(
                "tokens:\n  - principal: a\n    sha256: {}\n    roles: [{{role: view, namespaces: [ok, {namespace}]}}]\n",
                token_digest_hex("t")
            );
            let err = Authenticator::parse(&bad).expect_err("a namespace no object can be in");
            assert!(
                err.starts_with(&format!("tokens[0].roles[0].namespaces[1]: {shown}")),
                "{err}"
            );
        }
        let twice = |second: &str| {
            format!(
                "tokens:\n  - principal: ops\n    sha256: {}\n    roles: [{{role: view, namespaces: [a, b]}}]\n  - principal: ops\n    sha256: {}\n    roles: {second}\n",
                token_digest_hex("t1"),
                token_digest_hex("t2")
            )
        };
        let err = Authenticator::parse(&twice("[{role: admin}]")).expect_err("other roles");
        assert!(
            err.starts_with("tokens[1].roles: principal \"ops\" is also listed at tokens[0]"),
            "{err}"
        );
        // A rotation: a second token of the same principal with the same roles.
        Authenticator::parse(&twice(
            "[{role: view, namespaces: [b]}, {role: view, namespaces: [a]}]",
        ))
        .expect("the same roles in another order");
        let cleartext = "tokens:\n  - principal: a\n    token: secret\n";
        assert!(
            Authenticator::parse(cleartext).is_err(),
            "clear-text tokens are not accepted"
        );
    }
}
