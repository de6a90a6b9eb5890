//! Portable plans as OCI artifacts, over the distribution spec's HTTP API.
//!
//! A small blocking client on `ureq` rather than `oci-client`: the calls
//! needed are five (blob HEAD, upload POST + PUT, manifest PUT, manifest and
//! blob GET), every one of them must be size-capped and time-limited as
//! untrusted input, and `oci-client` brings an async runtime (tokio +
//! reqwest) into a binary that starts before every launch it wraps.
//!
//! The artifact (docs/reference/oci.md): an OCI image manifest with
//! `artifactType` [`ARTIFACT_TYPE`], the empty config, and one layer of
//! [`LAYER_TYPE`] whose bytes are the exported file.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::{sha256_digest, Error, PortablePlan};

mod auth;
pub use auth::{auth_files, credentials, parse_challenge, Challenge, Credentials};

pub const ARTIFACT_TYPE: &str = "application/vnd.warmstart.plan.v1";
pub const LAYER_TYPE: &str = "application/vnd.warmstart.plan.v1+gzip";
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY: &[u8] = b"{}";
/// A manifest of one layer is a few hundred bytes.
const MAX_MANIFEST: u64 = 1 << 20;
/// Token responses, error bodies.
const MAX_SMALL: u64 = 1 << 20;

/// `[registry/]repository[:tag][@sha256:hex]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, as it appears in credential files.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`: pulls verify the manifest against it.
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference, Error> {
        let bad = |why: &str| Error::BadReference {
            reference: s.into(),
            why: why.into(),
        };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("digest must be sha256:<hex>"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return Err(bad("digest must be sha256: and 64 lowercase hex digits"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((h, p)) if h.contains('.') || h.contains(':') || h == "localhost" => {
                (h.to_string(), p)
            }
            _ => ("docker.io".to_string(), rest),
        };
        // A tag is after the last ':' that follows the last '/'.
        let (repo, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        let mut repository = repo.to_string();
        if registry == "docker.io" && !repository.contains('/') {
            repository = format!("library/{repository}");
        }
        let comp_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
        };
        if repository.split('/').any(|c| !comp_ok(c)) {
            return Err(bad(
                "repository components are lowercase letters, digits, '.', '_', '-'",
            ));
        }
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(bad("a tag is up to 128 letters, digits, '.', '_', '-'"));
            }
        }
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What a manifest is fetched or stored by: the digest if pinned,
    /// else the tag, else `latest`.
    fn target(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// Loopback registries speak plain HTTP (as test and local registries
    /// do); every other one HTTPS.
    fn loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        matches!(host, "localhost" | "127.0.0.1" | "[::1]") || host.starts_with("127.")
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    artifact_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

/// A client for one repository.
pub struct Client {
    agent: ureq::Agent,
    reference: Reference,
    base: String,
    creds: Option<Credentials>,
    /// `Authorization` header value, once a challenge was answered.
    auth: Option<String>,
}

impl Client {
    /// `timeout` bounds each request as a whole; connecting gets at most
    /// 5 s of it. `plain_http` forces HTTP for a non-loopback registry.
    pub fn new(reference: Reference, timeout: Duration, plain_http: bool) -> Result<Client, Error> {
        let creds = credentials(&reference, &auth_files())?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout.min(Duration::from_secs(5)))
            .timeout(timeout)
            .redirects(5)
            .user_agent(concat!("warmstart/", env!("CARGO_PKG_VERSION")))
            .build();
        let host = if reference.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &reference.registry
        };
        let scheme = if plain_http || reference.loopback() {
            "http"
        } else {
            "https"
        };
        Ok(Client {
            agent,
            base: format!("{scheme}://{host}/v2/{}", reference.repository),
            reference,
            creds,
            auth: None,
        })
    }

    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Where the credentials came from, if any were found.
    pub fn credentials_source(&self) -> Option<&Path> {
        self.creds.as_ref().map(|c| c.source.as_path())
    }

    fn err(&self, what: impl Into<String>) -> Error {
        Error::Registry {
            registry: self.reference.registry.clone(),
            what: what.into(),
        }
    }

    /// One request, answering an authentication challenge once.
    fn call(
        &mut self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<ureq::Response, Error> {
        for attempt in 0..2 {
            let mut req = self.agent.request(method, url);
            for (k, v) in headers {
                req = req.set(k, v);
            }
            if let Some(a) = &self.auth {
                req = req.set("Authorization", a);
            }
            let res = match body {
                Some(b) => req.send_bytes(b),
                None => req.call(),
            };
            match res {
                Ok(r) => return Ok(r),
                Err(ureq::Error::Status(401, r)) if attempt == 0 => {
                    let ch = r.header("www-authenticate").and_then(parse_challenge);
                    self.authenticate(ch)?;
                }
                Err(ureq::Error::Status(code, r)) => {
                    let msg = read_capped(r, MAX_SMALL)
                        .map(|b| error_message(&b))
                        .unwrap_or_default();
                    let hint = match code {
                        401 | 403 => match &self.creds {
                            Some(c) => format!(" (credentials from {})", c.source.display()),
                            None => " (no credentials found: `docker login` or `podman login`, \
                                     or set REGISTRY_AUTH_FILE)"
                                .to_string(),
                        },
                        _ => String::new(),
                    };
                    return Err(self.err(format!("{method} {url}: HTTP {code}{msg}{hint}")));
                }
                Err(ureq::Error::Transport(t)) => {
                    return Err(self.err(format!("{method} {url}: {t}")))
                }
            }
        }
        Err(self.err(format!(
            "{method} {url}: still unauthorized after authenticating"
        )))
    }

    fn authenticate(&mut self, ch: Option<Challenge>) -> Result<(), Error> {
        let basic = self.creds.as_ref().map(|c| {
            let b = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", c.user, c.password));
            format!("Basic {b}")
        });
        match ch {
            Some(Challenge::Basic) | None => {
                self.auth = Some(basic.ok_or_else(|| {
                    self.err("authentication required and no credentials found (`docker login` or `podman login`, or set REGISTRY_AUTH_FILE)")
                })?);
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let mut req = self.agent.get(&realm);
                if let Some(s) = &service {
                    req = req.query("service", s);
                }
                let scope = scope.unwrap_or_else(|| {
                    format!("repository:{}:pull,push", self.reference.repository)
                });
                req = req.query("scope", &scope);
                if let Some(b) = &basic {
                    req = req.set("Authorization", b);
                }
                let r = req
                    .call()
                    .map_err(|e| self.err(format!("token from {realm}: {e}")))?;
                #[derive(Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let body = read_capped(r, MAX_SMALL).map_err(|e| self.err(e))?;
                let t: Token = serde_json::from_slice(&body)
                    .map_err(|e| self.err(format!("token from {realm}: {e}")))?;
                let t = t
                    .token
                    .or(t.access_token)
                    .ok_or_else(|| self.err(format!("token from {realm}: none in the answer")))?;
                self.auth = Some(format!("Bearer {t}"));
            }
        }
        Ok(())
    }

    fn push_blob(&mut self, bytes: &[u8]) -> Result<String, Error> {
        let digest = sha256_digest(bytes);
        let url = format!("{}/blobs/{digest}", self.base);
        if self.call("HEAD", &url, &[], None).is_ok() {
            return Ok(digest);
        }
        let start = format!("{}/blobs/uploads/", self.base);
        let r = self.call("POST", &start, &[], Some(&[]))?;
        let loc = r
            .header("location")
            .ok_or_else(|| self.err("upload started without a Location"))?
            .to_string();
        // Relative locations are relative to the registry's root.
        let loc = if loc.starts_with('/') {
            let root = self.base.split("/v2/").next().unwrap_or_default();
            format!("{root}{loc}")
        } else {
            loc
        };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let put = format!("{loc}{sep}digest={digest}");
        self.call(
            "PUT",
            &put,
            &[("Content-Type", "application/octet-stream")],
            Some(bytes),
        )?;
        Ok(digest)
    }

    /// Pushes `plan` and returns the manifest's digest. The manifest is
    /// also tagged with each of `also` (e.g. [`program_key`]).
    pub fn push(&mut self, plan: &PortablePlan, also: &[String]) -> Result<String, Error> {
        let layer = plan.to_bytes();
        let layer_digest = self.push_blob(&layer)?;
        let config_digest = self.push_blob(EMPTY)?;
        let mut ann = std::collections::BTreeMap::new();
        ann.insert(
            "org.opencontainers.image.title".into(),
            format!("{}.wsplan", plan.profile),
        );
        ann.insert("dev.warmstart.profile".into(), plan.profile.clone());
        ann.insert("dev.warmstart.command".into(), plan.meta.command.join(" "));
        let m = Manifest {
            schema_version: 2,
            media_type: MANIFEST_TYPE.into(),
            artifact_type: Some(ARTIFACT_TYPE.into()),
            config: Descriptor {
                media_type: EMPTY_TYPE.into(),
                digest: config_digest,
                size: EMPTY.len() as u64,
            },
            layers: vec![Descriptor {
                media_type: LAYER_TYPE.into(),
                digest: layer_digest,
                size: layer.len() as u64,
            }],
            annotations: Some(ann),
        };
        let body = serde_json::to_vec(&m).expect("a manifest serializes");
        let digest = sha256_digest(&body);
        if let Some(d) = &self.reference.digest {
            if *d != digest {
                return Err(Error::DigestMismatch {
                    what: "the manifest to push".into(),
                    expected: d.clone(),
                    actual: digest,
                });
            }
        }
        let targets =
            std::iter::once(self.reference.target().to_string()).chain(also.iter().cloned());
        for t in targets.collect::<Vec<_>>() {
            let url = format!("{}/manifests/{t}", self.base);
            self.call("PUT", &url, &[("Content-Type", MANIFEST_TYPE)], Some(&body))?;
        }
        Ok(digest)
    }

    /// Pulls and validates a plan; returns it with the manifest's digest.
    /// A pinned reference must match the manifest, and the layer its
    /// descriptor's digest, byte for byte.
    pub fn pull(&mut self) -> Result<(PortablePlan, String), Error> {
        let url = format!("{}/manifests/{}", self.base, self.reference.target());
        let r = self.call("GET", &url, &[("Accept", MANIFEST_TYPE)], None)?;
        let body = read_capped(r, MAX_MANIFEST).map_err(|e| self.err(e))?;
        let digest = sha256_digest(&body);
        if let Some(d) = &self.reference.digest {
            if *d != digest {
                return Err(Error::DigestMismatch {
                    what: format!("manifest of {}", self.reference),
                    expected: d.clone(),
                    actual: digest,
                });
            }
        }
        let m: Manifest = serde_json::from_slice(&body)
            .map_err(|e| self.err(format!("manifest of {}: {e}", self.reference)))?;
        let ours = m.artifact_type.as_deref() == Some(ARTIFACT_TYPE)
            || m.config.media_type == ARTIFACT_TYPE;
        let layer = match (&m.layers[..], ours) {
            ([l], true) if l.media_type == LAYER_TYPE => l,
            _ => {
                return Err(self.err(format!(
                    "{} is not a warmstart plan (artifact type {:?}, {} layer(s))",
                    self.reference,
                    m.artifact_type.as_deref().unwrap_or(&m.config.media_type),
                    m.layers.len()
                )))
            }
        };
        if layer.size > crate::format::MAX_FILE {
            return Err(Error::TooLarge {
                len: layer.size,
                max: crate::format::MAX_FILE,
            });
        }
        let url = format!("{}/blobs/{}", self.base, layer.digest);
        let r = self.call("GET", &url, &[], None)?;
        let bytes = read_capped(r, layer.size).map_err(|e| self.err(e))?;
        let actual = sha256_digest(&bytes);
        if actual != layer.digest {
            return Err(Error::DigestMismatch {
                what: format!("layer of {}", self.reference),
                expected: layer.digest.clone(),
                actual,
            });
        }
        Ok((PortablePlan::from_bytes(&bytes)?, digest))
    }
}

/// The tag a plan is found by for a program, from content alone:
/// `sha256-` and the SHA-256 of the executable's SHA-256 and the
/// arguments. Every machine with the same executable bytes computes the
/// same key for the same command line, whatever its path or inode.
pub fn program_key(exe: &Path, args: &[String]) -> Result<String, Error> {
    use sha2::Digest;
    use std::io::Read;
    let real = std::fs::canonicalize(exe).map_err(|e| Error::io(exe, e))?;
    let mut local = crate::identity::open_local(&real)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = local.file.read(&mut buf).map_err(|e| Error::io(&real, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let mut k = sha2::Sha256::new();
    k.update(b"warmstart-program-v1\0");
    k.update(h.finalize());
    for a in args {
        k.update(b"\0");
        k.update(a.as_bytes());
    }
    Ok(format!("sha256-{}", crate::hex(&k.finalize())))
}

/// A response body, refused past `max` bytes.
fn read_capped(r: ureq::Response, max: u64) -> Result<Vec<u8>, String> {
    let mut v = Vec::new();
    r.into_reader()
        .take(max + 1)
        .read_to_end(&mut v)
        .map_err(|e| format!("reading the answer: {e}"))?;
    if v.len() as u64 > max {
        return Err(format!("answer larger than {max} bytes"));
    }
    Ok(v)
}

/// The distribution spec's `{"errors":[{"code","message"}]}`, as text.
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct E {
        code: Option<String>,
        message: Option<String>,
    }
    #[derive(Deserialize)]
    struct Errs {
        errors: Vec<E>,
    }
    match serde_json::from_slice::<Errs>(body) {
        Ok(e) if !e.errors.is_empty() => {
            let parts: Vec<String> = e
                .errors
                .iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e.code.as_deref().unwrap_or(""),
                        e.message.as_deref().unwrap_or("")
                    )
                    .trim()
                    .to_string()
                })
                .collect();
            format!(": {}", parts.join("; "))
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
