//! Registry credentials (docker's and podman's files) and the
//! `WWW-Authenticate` challenges that say how to present them.

use std::path::PathBuf;

use base64::Engine as _;
use serde::Deserialize;

use super::Reference;
use crate::Error;

/// `user:password` for a registry, and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
    pub source: PathBuf,
}

/// The credential files, in podman's order: `$REGISTRY_AUTH_FILE`,
/// `$XDG_RUNTIME_DIR/containers/auth.json`, then docker's
/// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`.
pub fn auth_files() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut v = Vec::new();
    v.extend(env("REGISTRY_AUTH_FILE"));
    v.extend(env("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    match env("DOCKER_CONFIG") {
        Some(d) => v.push(d.join("config.json")),
        None => v.extend(env("HOME").map(|h| h.join(".docker/config.json"))),
    }
    v
}

/// Credentials for `r` from the first of `files` that has an entry: a key
/// naming the registry (with or without a scheme, docker.io's historic
/// `https://index.docker.io/v1/` included) or, as podman writes them, the
/// registry plus a prefix of the repository (the longest wins).
pub fn credentials(r: &Reference, files: &[PathBuf]) -> Result<Option<Credentials>, Error> {
    #[derive(Deserialize)]
    struct Entry {
        auth: Option<String>,
    }
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        auths: std::collections::HashMap<String, Entry>,
    }
    let full = format!("{}/{}", r.registry, r.repository);
    for path in files {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(path, e)),
        };
        let auth_err = |why: String| Error::Auth {
            path: path.clone(),
            why,
        };
        let f: File = serde_json::from_slice(&bytes).map_err(|e| auth_err(e.to_string()))?;
        let mut best: Option<(usize, &str)> = None;
        for (key, e) in &f.auths {
            let Some(auth) = e.auth.as_deref().filter(|a| !a.is_empty()) else {
                continue;
            };
            let k = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/');
            let k = if k == "index.docker.io/v1"
                || k == "index.docker.io"
                || k == "registry-1.docker.io"
            {
                "docker.io"
            } else {
                k
            };
            let hit = k == r.registry
                || (full.starts_with(k) && full.as_bytes().get(k.len()) == Some(&b'/'))
                || k == full;
            if hit && best.is_none_or(|(n, _)| k.len() > n) {
                best = Some((k.len(), auth));
            }
        }
        if let Some((_, auth)) = best {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| auth_err(format!("auth for {} is not base64: {e}", r.registry)))?;
            let text = String::from_utf8(raw)
                .map_err(|_| auth_err(format!("auth for {} is not UTF-8", r.registry)))?;
            let (user, password) = text
                .split_once(':')
                .ok_or_else(|| auth_err(format!("auth for {} is not user:password", r.registry)))?;
            return Ok(Some(Credentials {
                user: user.into(),
                password: password.into(),
                source: path.clone(),
            }));
        }
    }
    Ok(None)
}

/// A challenge from `WWW-Authenticate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses `Basic realm="x"` or `Bearer realm="…",service="…",scope="…"`.
pub fn parse_challenge(h: &str) -> Option<Challenge> {
    let (scheme, rest) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = std::collections::HashMap::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (k, v) = s.split_once('=')?;
        let v = v.trim_start();
        let (val, after) = if let Some(q) = v.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            v.split_once(',').map_or((v, ""), |(a, b)| (a, b))
        };
        params.insert(k.trim().to_ascii_lowercase(), val.to_string());
        s = after.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: params.remove("realm")?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}
