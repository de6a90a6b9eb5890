//! The daemon's registry lookups (`registry` in the config file): a plan
//! for a program is pulled by the tag `warmstart push` gives it, computed
//! from the program's content, and checked against this machine's files
//! before the daemon installs it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use warmstart_launch::daemon::{DaemonConfig, FoundPlan, PlanLookup};
use warmstart_portable::format;
use warmstart_portable::oci::program_key;
use warmstart_portable::{Client, Error, Reference};

use super::human_bytes;
use super::portable::find_program;

/// Pulls plans from one repository.
pub struct RegistryLookup {
    /// The repository, as parsed (no tag, no digest).
    repo: Reference,
    timeout: Duration,
    plain_http: bool,
}

/// The lookup the config asks for, if any; a repository that does not
/// parse is a configuration error.
pub fn from_config(cfg: &DaemonConfig) -> Result<Option<Arc<dyn PlanLookup>>> {
    let Some(r) = &cfg.registry else {
        return Ok(None);
    };
    let repo = Reference::parse(r)?;
    if repo.tag.is_some() || repo.digest.is_some() {
        bail!("registry {r:?}: give a repository without a tag or digest");
    }
    Ok(Some(Arc::new(RegistryLookup {
        repo,
        timeout: Duration::from_secs(cfg.registry_timeout_s.max(1)),
        plain_http: cfg.registry_plain_http,
    })))
}

/// The registry's "no such manifest" (or repository): no plan, not a
/// failure. The client reports the status in its message.
fn not_found(e: &Error) -> bool {
    matches!(e, Error::Registry { what, .. } if what.contains(": HTTP 404"))
}

impl PlanLookup for RegistryLookup {
    fn lookup(&self, argv: &[String]) -> Result<Option<FoundPlan>, String> {
        // A program that is gone or unreadable has no key: nothing to ask.
        let Some(exe) = find_program(argv) else {
            return Ok(None);
        };
        let Ok(key) = program_key(&exe, &argv[1..]) else {
            return Ok(None);
        };
        let mut reference = self.repo.clone();
        reference.tag = Some(key);
        let mut c =
            Client::new(reference, self.timeout, self.plain_http).map_err(|e| e.to_string())?;
        let (pp, digest) = match c.pull() {
            Ok(p) => p,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        // A plan that does not validate is the registry's content, not
        // its being down: no plan.
        let imp = match format::import(&pp, Path::new("/")) {
            Ok(i) => i,
            Err(_) => return Ok(None),
        };
        if imp.plan.files.is_empty() {
            return Ok(None);
        }
        let note = format!(
            "pulled from {}/{}@{digest}: {} of {} files, {} of {}",
            self.repo.registry,
            self.repo.repository,
            imp.plan.files.len(),
            pp.files.len(),
            human_bytes(imp.kept_bytes),
            human_bytes(imp.total_bytes)
        );
        Ok(Some(FoundPlan {
            dropped: imp
                .dropped
                .iter()
                .map(|d| format!("{}: {}", d.path, d.why))
                .collect(),
            plan: imp.plan,
            note,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_repository_is_checked_at_start() {
        let with = |r: Option<&str>| DaemonConfig {
            registry: r.map(String::from),
            ..Default::default()
        };
        assert!(
            from_config(&with(None)).unwrap().is_none(),
            "off by default"
        );
        assert!(from_config(&with(Some("127.0.0.1:5000/warmstart/plans")))
            .unwrap()
            .is_some());
        for bad in ["127.0.0.1:5000/plans:v1", "127.0.0.1:5000/Plans"] {
            assert!(from_config(&with(Some(bad))).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_missing_manifest_means_no_plan() {
        let e = |what: &str| Error::Registry {
            registry: "r".into(),
            what: what.into(),
        };
        assert!(not_found(&e(
            "GET http://r/v2/p/manifests/sha256-00: HTTP 404: MANIFEST_UNKNOWN"
        )));
        assert!(!not_found(&e("GET http://r/v2/p/manifests/x: HTTP 500")));
        assert!(!not_found(&e(
            "GET http://r/v2/p/manifests/x: Connection refused"
        )));
    }
}
