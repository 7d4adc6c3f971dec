//! `--web-config FILE`: TLS and basic auth for the exporter, in the format
//! of Prometheus's exporter-toolkit (what node_exporter reads), so one file
//! serves both:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt        # or `cert:` with the PEM inline
//!   key_file: server.key         # or `key:`
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: clients.crt                    # with it
//!   min_version: TLS12           # TLS12 (default) or TLS13
//! http_server_config:
//!   headers: { Strict-Transport-Security: max-age=31536000 }
//! basic_auth_users:
//!   prometheus: $2y$10$...       # bcrypt, e.g. htpasswd -nBC 10 "" | tr -d ':\n'
//! ```
//!
//! Relative paths are taken from the file's folder, as exporter-toolkit
//! does. Options exporter-toolkit has and wattprof does not honour
//! (cipher suites, curves, client SAN lists, unverified client
//! certificates) are refused with a line saying so, never ignored.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio_rustls::rustls;

/// The file as written (exporter-toolkit's field names).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    /// wattprof answers HTTP/1.1 whatever this says (Prometheus scrapes
    /// HTTP/1.1); accepted so node_exporter's files load unchanged.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// A loaded `--web-config`.
#[derive(Debug)]
pub(crate) struct WebConfig {
    /// The TLS setup, when the file has `tls_server_config`.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Users and their bcrypt hashes; empty: no authentication.
    users: HashMap<String, String>,
    /// A hash of the users' cost, checked for unknown users so a wrong
    /// user name costs the same time as a wrong password (no user
    /// enumeration by timing).
    dummy: String,
    /// Headers added to every answer.
    pub(crate) headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// `Authorization` values already checked good: bcrypt costs tens of
    /// milliseconds by design, far more than a scrape, so each
    /// user/password pair is verified once (exporter-toolkit does the
    /// same). Bounded; cleared when full.
    verified: Mutex<HashSet<String>>,
}

/// Good `Authorization` values remembered at most.
const MAX_VERIFIED: usize = 64;

/// A `--web-config` that cannot be used: the message names the file and
/// what to change.
#[derive(Debug, thiserror::Error)]
#[error("--web-config {}: {message}", path.display())]
pub(crate) struct WebConfigError {
    path: PathBuf,
    message: String,
}

/// What an `Authorization` header gets.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Auth {
    /// Let through.
    Allowed,
    /// Not let through (401).
    Denied,
    /// Needs a bcrypt check: pass the value to [`WebConfig::verify`]
    /// off the I/O thread.
    Check(String),
}

impl WebConfig {
    /// Reads and checks `path`: certificates and keys are loaded and every
    /// hash is parsed now, so a bad file fails at start, not at the first
    /// scrape.
    pub(crate) fn load(path: &Path) -> Result<Self, WebConfigError> {
        let fail = |message: String| WebConfigError {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            serde_yaml_ng::from_str(&text).map_err(|e| {
                fail(format!(
                    "{e} (the format is Prometheus's exporter-toolkit web config)"
                ))
            })?
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let tls = file
            .tls_server_config
            .map(|t| tls_config(t, dir))
            .transpose()
            .map_err(fail)?
            .map(Arc::new);
        let mut users = HashMap::new();
        for (user, hash) in file.basic_auth_users.unwrap_or_default() {
            if user.contains(':') {
                return Err(fail(format!(
                    "basic_auth_users: user `{user}` has a `:`, which basic auth cannot carry"
                )));
            }
            if hash.parse::<bcrypt::HashParts>().is_err() {
                return Err(fail(format!(
                    "basic_auth_users: `{user}`'s password is not a bcrypt hash (make one with \
                     htpasswd -nBC 10 \"\" | tr -d ':\\n')"
                )));
            }
            users.insert(user, hash);
        }
        let cost = users
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|h| h.get_cost())
            .max()
            .unwrap_or(4);
        let dummy = if users.is_empty() {
            String::new()
        } else {
            bcrypt::hash("wattprof: no such user", cost).unwrap_or_default()
        };
        let mut headers = Vec::new();
        for (name, value) in file
            .http_server_config
            .and_then(|h| h.headers)
            .unwrap_or_default()
        {
            let bad = || {
                fail(format!(
                    "http_server_config.headers: `{name}: {value}` is not a valid header"
                ))
            };
            let name = hyper::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            let value = hyper::header::HeaderValue::from_str(&value).map_err(|_| bad())?;
            if [
                hyper::header::CONTENT_TYPE,
                hyper::header::CONTENT_LENGTH,
                hyper::header::CONTENT_ENCODING,
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::TRANSFER_ENCODING,
                hyper::header::CONNECTION,
            ]
            .contains(&name)
            {
                return Err(fail(format!(
                    "http_server_config.headers: `{name}` is set by the exporter itself"
                )));
            }
            headers.push((name, value));
        }
        Ok(Self {
            tls,
            users,
            dummy,
            headers,
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// Whether answers need a user and password.
    #[cfg(test)]
    pub(crate) fn needs_auth(&self) -> bool {
        !self.users.is_empty()
    }

    /// What a request with this `Authorization` header value gets.
    pub(crate) fn check(&self, authorization: Option<&[u8]>) -> Auth {
        if self.users.is_empty() {
            return Auth::Allowed;
        }
        let Some(value) = authorization.and_then(|v| std::str::from_utf8(v).ok()) else {
            return Auth::Denied;
        };
        if self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(value)
        {
            return Auth::Allowed;
        }
        Auth::Check(value.to_string())
    }

    /// The bcrypt check of an `Authorization` value (slow by design: call
    /// it off the I/O thread). Good values are remembered.
    pub(crate) fn verify(&self, authorization: &str) -> bool {
        let Some((user, password)) = basic_credentials(authorization) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (self.dummy.as_str(), false),
        };
        let good = bcrypt::verify(password.as_bytes(), hash).unwrap_or(false) && known;
        if good {
            let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
            verified.insert(authorization.to_string());
        }
        good
    }
}

/// The user and password of a `Basic` `Authorization` value.
fn basic_credentials(value: &str) -> Option<(String, String)> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// The PEM blocks of `inline` or of the file at `path` (relative to `dir`).
fn pem_source(
    inline: Option<String>,
    path: Option<PathBuf>,
    dir: &Path,
    what: &str,
) -> Result<(Vec<u8>, String), String> {
    match (inline, path) {
        (Some(_), Some(_)) => Err(format!(
            "tls_server_config: give `{what}` or `{what}_file`, not both"
        )),
        (Some(text), None) => Ok((text.into_bytes(), format!("`{what}`"))),
        (None, Some(p)) => {
            let p = dir.join(p);
            std::fs::read(&p)
                .map(|b| (b, p.display().to_string()))
                .map_err(|e| format!("cannot read {}: {e}", p.display()))
        }
        (None, None) => Err(format!(
            "tls_server_config needs `{what}_file` (or `{what}`)"
        )),
    }
}

fn certificates(pem: &[u8], from: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{from}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{from}: no certificate (expected a PEM `BEGIN CERTIFICATE` block)"
        ));
    }
    Ok(certs)
}

/// The TLS versions `min_version` to `max_version` allow (1.2 and 1.3;
/// 1.0 and 1.1 refused as insecure).
fn protocol_versions(
    t: &TlsFile,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let version = |v: &Option<String>, field: &str| -> Result<Option<u8>, String> {
        match v.as_deref() {
            None | Some("") => Ok(None),
            Some("TLS12") => Ok(Some(12)),
            Some("TLS13") => Ok(Some(13)),
            Some("TLS10" | "TLS11") => Err(format!(
                "tls_server_config.{field}: TLS 1.0 and 1.1 are not offered (insecure): use TLS12 or TLS13"
            )),
            Some(other) => Err(format!(
                "tls_server_config.{field}: `{other}` is not a TLS version (TLS12 or TLS13)"
            )),
        }
    };
    let min = version(&t.min_version, "min_version")?.unwrap_or(12);
    let max = version(&t.max_version, "max_version")?.unwrap_or(13);
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();
    if versions.is_empty() {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    Ok(versions)
}

/// The client certificate check `client_auth_type` and `client_ca_file`
/// ask for: none, verified if given, or required and verified. Modes that
/// accept unverified certificates are refused.
fn client_verifier(
    t: &TlsFile,
    dir: &Path,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, String> {
    let auth_type = t.client_auth_type.as_deref().unwrap_or("");
    let roots = match &t.client_ca_file {
        Some(p) => {
            let p = dir.join(p);
            let pem = std::fs::read(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(&pem, &p.display().to_string())? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: unusable CA certificate: {e}", p.display()))?;
            }
            Some(Arc::new(roots))
        }
        None => None,
    };
    let verifier = match (auth_type, roots) {
        ("" | "NoClientCert", None) => None,
        ("" | "NoClientCert", Some(_)) => {
            return Err(
                "tls_server_config: client_ca_file is given without a client_auth_type: add \
                 client_auth_type: RequireAndVerifyClientCert (or VerifyClientCertIfGiven)"
                    .into(),
            );
        }
        ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven", None) => {
            return Err(format!(
                "tls_server_config: client_auth_type {auth_type} needs client_ca_file (the CA \
                 that signs client certificates)"
            ));
        }
        ("RequireAndVerifyClientCert", Some(roots)) => Some(
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?,
        ),
        ("VerifyClientCertIfGiven", Some(roots)) => Some(
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?,
        ),
        ("RequestClientCert" | "RequireAnyClientCert", _) => {
            return Err(format!(
                "tls_server_config: client_auth_type {auth_type} accepts certificates nobody \
                 verified and is not supported: use RequireAndVerifyClientCert with client_ca_file"
            ));
        }
        (other, _) => {
            return Err(format!(
                "tls_server_config: client_auth_type `{other}` is unknown (NoClientCert, \
                 VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            ));
        }
    };
    Ok(verifier)
}

fn tls_config(t: TlsFile, dir: &Path) -> Result<rustls::ServerConfig, String> {
    for (name, set) in [
        (
            "cipher_suites",
            t.cipher_suites.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "curve_preferences",
            t.curve_preferences.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        (
            "client_allowed_sans",
            t.client_allowed_sans
                .as_ref()
                .is_some_and(|v| !v.is_empty()),
        ),
    ] {
        if set {
            return Err(format!(
                "tls_server_config.{name} is not supported by wattprof (it uses rustls's safe \
                 defaults): remove it"
            ));
        }
    }
    let _ = t.prefer_server_cipher_suites;
    let versions = protocol_versions(&t)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = client_verifier(&t, dir, &provider)?;
    let (cert_pem, cert_from) = pem_source(t.cert, t.cert_file, dir, "cert")?;
    let certs = certificates(&cert_pem, &cert_from)?;
    let (key_pem, key_from) = pem_source(t.key, t.key_file, dir, "key")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!("{key_from}: no private key ({e}; expected PEM PKCS#8, PKCS#1 or SEC1)")
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!("{cert_from} and {key_from}: {e} (does the key belong to the certificate?)")
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn error(dir: &Path, text: &str) -> String {
        let p = write(dir, "web.yml", text);
        WebConfig::load(&p)
            .expect_err("should be refused")
            .to_string()
    }

    #[test]
    fn basic_auth_is_checked_with_bcrypt_and_remembered() {
        let dir = tempfile::tempdir().expect("dir");
        let hash = bcrypt::hash("s3cret", 4).expect("hash");
        let p = write(
            dir.path(),
            "web.yml",
            &format!("basic_auth_users:\n  prom: '{hash}'\n"),
        );
        let web = WebConfig::load(&p).expect("load");
        assert!(web.tls.is_none() && web.needs_auth());
        let header = |u: &str, pw: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{pw}"))
            )
        };
        assert_eq!(web.check(None), Auth::Denied);
        let good = header("prom", "s3cret");
        assert_eq!(web.check(Some(good.as_bytes())), Auth::Check(good.clone()));
        assert!(web.verify(&good));
        // Remembered: no second bcrypt.
        assert_eq!(web.check(Some(good.as_bytes())), Auth::Allowed);
        for bad in [
            header("prom", "wrong"),
            header("other", "s3cret"),
            "Bearer x".into(),
            "Basic !!!".into(),
        ] {
            assert!(!web.verify(&bad), "{bad}");
            assert_ne!(web.check(Some(bad.as_bytes())), Auth::Allowed, "{bad}");
        }
        // An empty file: no TLS, no auth.
        let empty = write(dir.path(), "empty.yml", "");
        assert_eq!(
            WebConfig::load(&empty).expect("empty").check(None),
            Auth::Allowed
        );
    }

    #[test]
    fn bad_files_get_a_line_naming_the_field() {
        let dir = tempfile::tempdir().expect("dir");
        let d = dir.path();
        let cases = [
            ("tls_server_confg: {}\n", "unknown field `tls_server_confg`"),
            ("basic_auth_users:\n  prom: hunter2\n", "not a bcrypt hash"),
            (
                "tls_server_config:\n  key_file: k.pem\n",
                "needs `cert_file`",
            ),
            (
                "tls_server_config:\n  cert_file: missing.pem\n  key_file: k.pem\n",
                "cannot read",
            ),
            (
                "tls_server_config:\n  cert: x\n  cert_file: y\n  key: z\n",
                "not both",
            ),
            (
                "tls_server_config:\n  cert: x\n  key: y\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
                "cipher_suites is not supported",
            ),
            (
                "tls_server_config:\n  cert: 'no pem'\n  key: y\n",
                "no certificate",
            ),
            (
                "http_server_config:\n  headers:\n    Content-Type: x\n",
                "set by the exporter",
            ),
            ("- a list\n", "exporter-toolkit"),
        ];
        for (text, want) in cases {
            let e = error(d, text);
            assert!(e.contains(want) && e.contains("web.yml"), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_certificate_and_key_make_a_tls_server() {
        // A self-signed certificate made by the openssl command, where
        // there is one.
        let dir = tempfile::tempdir().expect("dir");
        let d = dir.path();
        if !crate::testutil::self_signed(d) {
            skip_test!("no openssl command to make a certificate");
            return;
        }
        let p = write(
            d,
            "web.yml",
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  min_version: TLS13\n",
        );
        let web = WebConfig::load(&p).expect("tls config");
        assert!(web.tls.is_some() && !web.needs_auth());
        let e = error(
            d,
            "tls_server_config:\n  cert_file: c.pem\n  key_file: c.pem\n",
        );
        assert!(e.contains("no private key"), "{e}");
        let e = error(
            d,
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  client_ca_file: c.pem\n",
        );
        assert!(e.contains("without a client_auth_type"), "{e}");
        let e = error(
            d,
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  min_version: TLS10\n",
        );
        assert!(e.contains("TLS 1.0"), "{e}");
        let ok = write(
            d,
            "mtls.yml",
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: c.pem\n",
        );
        assert!(WebConfig::load(&ok).is_ok_and(|w| w.tls.is_some()));
    }
}
