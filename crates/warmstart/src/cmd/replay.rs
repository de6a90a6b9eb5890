//! `warmstart replay`: prefetch a plan.

use anyhow::{Context, Result};
use warmstart_plan::Plan;
use warmstart_replay::{Engine, IoPriority, Options, RealBackend};

use crate::cli::ReplayArgs;
use crate::cmd::human_bytes;

pub fn run(args: ReplayArgs, quiet: bool) -> Result<i32> {
    let mut opts = Options::default();
    if let Some(w) = args.workers {
        opts.fixed_workers(w);
    }
    if let Some(p) = &args.ioprio {
        opts.io_priority = Some(
            p.parse::<IoPriority>()
                .map_err(|e| anyhow::anyhow!("--ioprio {p}: {e}"))?,
        );
    }
    if let Some(mib) = args.memory_floor {
        opts.memory_floor = Some(
            mib.checked_mul(1 << 20)
                .with_context(|| format!("--memory-floor {mib} MiB is too large"))?,
        );
    }
    opts.cpus = args.cpus.clone();
    if args.max_request < 4 {
        anyhow::bail!(
            "--max-request {} KiB: a request is at least one page, 4 KiB",
            args.max_request
        );
    }
    opts.max_request = args
        .max_request
        .checked_mul(1024)
        .with_context(|| format!("--max-request {} KiB is too large", args.max_request))?;
    if args.wait {
        opts.wait = Some(Options::DEFAULT_WAIT_TIMEOUT);
    }
    // Options first: a mistake in them is reported before any file is read.
    let bytes = super::read_container(&args.plan)?;
    let plan = Plan::from_bytes(&bytes).with_context(|| format!("{}", args.plan.display()))?;
    let backend = RealBackend::new();
    let report = Engine::new(&backend, opts)?.run(&plan)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !quiet {
        eprintln!(
            "warmstart: issued {} data + {} metadata in {} requests, {} lookups; skipped {} files ({}), {} metadata; {:.1} ms{}",
            human_bytes(report.data.bytes),
            human_bytes(report.meta.bytes),
            report.requests,
            report.lookups.done,
            report.skipped_files.len(),
            human_bytes(report.skipped_data.bytes),
            human_bytes(report.skipped_meta.bytes),
            report.timings.total_ns as f64 / 1e6,
            match &report.wait {
                Some(w) => format!(
                    ", {} of {} pages resident{}{}",
                    w.resident,
                    w.pages,
                    if w.timed_out {
                        " (timed out)"
                    } else if w.stalled {
                        " (gave up: no progress)"
                    } else {
                        ""
                    },
                    match w.files_unchecked {
                        0 => String::new(),
                        n => format!(", {n} files not checked (changed or gone since)"),
                    }
                ),
                None => String::new(),
            }
        );
        for f in &report.skipped_files {
            eprintln!("warmstart: skipped {}: {}", f.path, f.reason);
        }
        for e in &report.errors {
            eprintln!("warmstart: {e}");
        }
        if report.error_count > report.errors.len() as u64 {
            eprintln!(
                "warmstart: and {} more problems",
                report.error_count - report.errors.len() as u64
            );
        }
        if report.stopped_by_memory {
            eprintln!("warmstart: stopped early: memory is low");
        }
    }
    Ok(0)
}
