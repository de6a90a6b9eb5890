//! `warmstart record`: one launch -> one trace file.

use std::time::Duration;

use anyhow::{Context, Result};
use warmstart_launch::store::write_atomic;
use warmstart_plan::trace::CacheState;
use warmstart_plan::Trace;
use warmstart_record::{evict, BackendChoice, Options};

use crate::cli::{BackendArg, RecordArgs};
use crate::cmd::human_bytes;

pub fn backend(b: BackendArg) -> BackendChoice {
    match b {
        BackendArg::Auto => BackendChoice::Auto,
        BackendArg::Bpf => BackendChoice::Bpf,
        BackendArg::Tracefs => BackendChoice::Tracefs,
        BackendArg::Mincore => BackendChoice::Mincore,
    }
}

pub fn run(args: RecordArgs, quiet: bool) -> Result<i32> {
    let cache = if args.cold {
        if args.drop_caches {
            evict::drop_all_caches().context("dropping caches (needs root)")?;
        } else if let Some(prev) = &args.from {
            let bytes = super::read_container(prev)?;
            let t =
                Trace::from_bytes(&bytes).with_context(|| format!("reading {}", prev.display()))?;
            let n = evict::evict_files(t.files.iter().filter_map(|f| f.path.as_deref()));
            evict::evict_devices(t.metadata.iter().map(|m| m.device));
            if !quiet {
                eprintln!("warmstart: evicted {n} files known from {}", prev.display());
            }
        } else {
            anyhow::bail!(
                "--cold needs to know which files to evict: give --from PREVIOUS.trace, \
                 or --drop-caches to drop the whole system's cache"
            );
        }
        CacheState::Cold
    } else {
        CacheState::AsFound
    };
    let opts = Options {
        backend: backend(args.backend),
        idle: Duration::from_secs_f64(args.idle),
        timeout: Duration::from_secs_f64(args.timeout),
        cache,
        split_extents_ns: None,
    };
    // Write somewhere we can before running anything: the launch cannot
    // be repeated once the trace is lost.
    let out = &args.output;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    anyhow::ensure!(
        dir.is_dir(),
        "output directory {} does not exist",
        dir.display()
    );
    anyhow::ensure!(!out.is_dir(), "{} is a directory", out.display());
    tempfile::tempfile_in(dir)
        .with_context(|| format!("cannot write the trace into {}", dir.display()))?;
    let recorded = warmstart_record::record(&args.command, &opts, |_| {})?;
    for why in &recorded.fallbacks {
        eprintln!("warmstart: fell back from {why}");
    }
    let trace = &recorded.trace;
    write_atomic(out, &trace.to_bytes())?;
    if !quiet {
        let s = &trace.stats;
        eprintln!(
            "warmstart: recorded {} files, {} data ({} from storage), {} metadata, {} lookups in {:.2}s [{}; ended: {:?}] -> {}",
            trace.files.len(),
            human_bytes(s.bytes),
            human_bytes(s.bytes_from_storage),
            human_bytes(s.metadata_bytes),
            trace.namespace_ops.len(),
            s.duration_ns as f64 / 1e9,
            trace.meta.backend.name(),
            trace.meta.end,
            out.display()
        );
        if s.drops > 0 {
            eprintln!(
                "warmstart: WARNING: the kernel dropped {} events; the trace is incomplete",
                s.drops
            );
        }
        if s.pages_unresolved > 0 {
            eprintln!(
                "warmstart: {} pages could not be named and were left out",
                s.pages_unresolved
            );
        }
    }
    let exit = recorded.wait()?;
    warmstart_record::exit_like(exit)
}
