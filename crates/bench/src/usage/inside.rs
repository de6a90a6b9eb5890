//! `bench usage --fs`: the usage log replayed inside a storage testbed
//! ([`crate::testbed`]), so that prefetching before the launch is measured
//! on other file systems and on slow devices, where a launch-time prefetch
//! cannot read a plan in time.
//!
//! The outer harness writes the log it would replay into the testbed's
//! output directory and runs `usage` again inside with the same settings;
//! the inner harness's exports come back out when it is done.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result};

use super::log::{self, Boot};
use super::prefetcher::Mode;
use super::UsageArgs;
use crate::testbed::{self, Outer};

/// Runs the usage bench on `boots` inside the testbed `args.fs` names;
/// returns the inner harness's exit code.
pub fn run(
    args: &UsageArgs,
    boots: &[Boot],
    source: &str,
    modes: &[Mode],
    train: usize,
    quiet: bool,
) -> Result<i32> {
    let fs = args.fs.context("no --fs")?;
    let suite = args
        .suite
        .canonicalize()
        .with_context(|| format!("resolving {}", args.suite.display()))?;
    let mut binds: Vec<_> = suite.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(k) = &args.keep_state {
        // Kept at the same path inside and out.
        std::fs::create_dir_all(k).with_context(|| format!("creating {}", k.display()))?;
        binds.push(
            k.canonicalize()
                .with_context(|| format!("resolving {}", k.display()))?,
        );
    }
    let outer = Outer {
        fs,
        storage: args.storage,
        cache_dir: args.testbed_cache.clone(),
        contents: args.testbed_content.clone(),
        binds,
    };
    testbed::run_inside(
        outer,
        quiet,
        |host, inside| {
            std::fs::write(
                host.join(LOG),
                log::encode(&log::to_steps(boots)).as_bytes(),
            )
            .with_context(|| format!("writing the log into {}", host.display()))?;
            if let Some(c) = &args.daemon_config {
                std::fs::copy(c, host.join(DAEMON_CONFIG))
                    .with_context(|| format!("copying {}", c.display()))?;
            }
            Ok(inner_args(
                args, &suite, source, modes, train, inside, quiet,
            ))
        },
        |out| copy_out(args, out),
    )
}

/// Names in the output directory.
const LOG: &str = "usage-log.jsonl";
const DAEMON_CONFIG: &str = "daemon-config.toml";
const JSON: &str = "usage.json";
const MARKDOWN: &str = "usage.md";
const PLOT: &str = "plot";

/// The inner harness's arguments: the same settings, the log and the
/// daemon config from `out`, exports into `out`, no package installs (the
/// outer harness installed them on the host before the image was checked).
fn inner_args(
    a: &UsageArgs,
    suite: &Path,
    source: &str,
    modes: &[Mode],
    train: usize,
    out: &Path,
    quiet: bool,
) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["usage".into()];
    let mut push = |k: &str, val: Option<String>| {
        v.push(k.into());
        if let Some(x) = val {
            v.push(x.into());
        }
    };
    if quiet {
        push("--quiet", None);
    }
    push("--log", Some(out.join(LOG).display().to_string()));
    push("--log-source", Some(source.to_string()));
    push("--suite", Some(suite.display().to_string()));
    let m: Vec<&str> = modes.iter().map(|m| m.name()).collect();
    push("--modes", Some(m.join(",")));
    push("--train", Some(train.to_string()));
    push("--sequence-gap", Some(a.sequence_gap.to_string()));
    push("--timeout", Some(a.timeout.to_string()));
    push("--runs", Some(a.runs.to_string()));
    if a.learn_all {
        push("--learn-all", None);
    }
    if a.ignore_failure {
        push("--ignore-failure", None);
    }
    push("--no-install", None);
    if a.daemon_config.is_some() {
        push(
            "--daemon-config",
            Some(out.join(DAEMON_CONFIG).display().to_string()),
        );
    }
    if let Some(k) = &a.keep_state {
        let k = k.canonicalize().unwrap_or_else(|_| k.clone());
        push("--keep-state", Some(k.display().to_string()));
    }
    for (flag, set, file) in [
        ("--json", a.json.is_some(), JSON),
        ("--export-markdown", a.export_markdown.is_some(), MARKDOWN),
        ("--plot", a.plot.is_some(), PLOT),
    ] {
        if set {
            push(flag, Some(out.join(file).display().to_string()));
        }
    }
    v
}

/// Copies the inner harness's exports to where they were asked for.
fn copy_out(a: &UsageArgs, out: &Path) -> Result<()> {
    for (want, file) in [(&a.json, JSON), (&a.export_markdown, MARKDOWN)] {
        let (Some(to), from) = (want, out.join(file)) else {
            continue;
        };
        if from.exists() {
            std::fs::copy(&from, to).with_context(|| format!("writing {}", to.display()))?;
        }
    }
    if let Some(to) = &a.plot {
        testbed::copy_files(&out.join(PLOT), to)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: UsageArgs,
    }

    fn parse(argv: &[&str]) -> UsageArgs {
        Cli::try_parse_from(std::iter::once("usage").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_inner_harness_gets_the_same_settings_the_log_and_its_exports_inside() {
        let a = parse(&[
            "--fs",
            "xfs",
            "--storage",
            "cloud",
            "--learn-all",
            "--timeout",
            "60",
            "--runs",
            "3",
            "--json",
            "/home/u/u.json",
            "--plot",
            "/home/u/plots",
            "--daemon-config",
            "/home/u/d.toml",
        ]);
        let out = Path::new("/var/tmp/warmstart-bench-out-1");
        let v = inner_args(
            &a,
            Path::new("/src/bench/suite.toml"),
            "the default log (seed 7)",
            &[Mode::None, Mode::Predict],
            3,
            out,
            true,
        );
        let v: Vec<String> = v.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let after = |k: &str| v[v.iter().position(|x| x == k).unwrap() + 1].clone();
        assert_eq!(v[0], "usage");
        assert_eq!(
            after("--log"),
            "/var/tmp/warmstart-bench-out-1/usage-log.jsonl"
        );
        assert_eq!(after("--log-source"), "the default log (seed 7)");
        assert_eq!(after("--modes"), "none,predict");
        assert_eq!(after("--train"), "3");
        assert_eq!(after("--timeout"), "60");
        assert_eq!(after("--runs"), "3");
        assert_eq!(after("--json"), "/var/tmp/warmstart-bench-out-1/usage.json");
        assert_eq!(after("--plot"), "/var/tmp/warmstart-bench-out-1/plot");
        assert_eq!(
            after("--daemon-config"),
            "/var/tmp/warmstart-bench-out-1/daemon-config.toml"
        );
        for present in ["--quiet", "--learn-all", "--no-install"] {
            assert!(v.iter().any(|x| x == present), "{present} missing: {v:?}");
        }
        // The testbed's own options stay outside, or the inner harness
        // would build a testbed inside the testbed.
        for absent in ["--fs", "--storage", "--export-markdown", "--ignore-failure"] {
            assert!(!v.iter().any(|x| x == absent), "{absent} passed: {v:?}");
        }
        // What the inner harness gets, it parses.
        // (--quiet is the harness's global option, not usage's.)
        let own: Vec<&str> = v[1..]
            .iter()
            .map(String::as_str)
            .filter(|x| *x != "--quiet")
            .collect();
        let inner = parse(&own);
        assert!(inner.fs.is_none());
        assert_eq!(
            inner.log_source.as_deref(),
            Some("the default log (seed 7)")
        );
    }
}
