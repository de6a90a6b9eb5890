//! `warmstart compile`: traces -> plan.

use anyhow::{Context, Result};
use warmstart_plan::compile::CompileOptions;
use warmstart_plan::Trace;

use crate::cli::CompileArgs;
use crate::cmd::human_bytes;
use warmstart_launch::store::write_atomic;

pub fn options(a: &CompileArgs) -> CompileOptions {
    CompileOptions {
        min_traces: a.min_traces,
        merge_gap: a.merge_gap,
        merge_distance: a.merge_distance,
        metadata_shift: a.metadata_shift,
        sorted: a.sorted,
        min_launch_bytes: a.min_launch_bytes,
        exclude_paths: a.exclude.clone(),
        lookups: !a.no_lookups,
        unused: a.keep_unused,
    }
}

pub fn run(args: CompileArgs, quiet: bool) -> Result<i32> {
    for e in &args.exclude {
        anyhow::ensure!(
            e.starts_with('/'),
            "--exclude {e:?}: give an absolute path prefix, such as /home"
        );
    }
    // Each input once (the same launch twice would pass any k-of-n), and
    // never the output among them.
    let out = std::fs::canonicalize(&args.output).ok();
    let mut seen = Vec::new();
    let mut traces = Vec::new();
    for p in &args.traces {
        let real = std::fs::canonicalize(p).with_context(|| format!("reading {}", p.display()))?;
        anyhow::ensure!(
            out.as_ref() != Some(&real),
            "{} is both an input and the output",
            p.display()
        );
        anyhow::ensure!(!seen.contains(&real), "{} is given twice", p.display());
        seen.push(real);
        let bytes = super::read_container(p)?;
        traces.push(Trace::from_bytes(&bytes).with_context(|| format!("{}", p.display()))?);
    }
    let t = std::time::Instant::now();
    let compiled = warmstart_launch::compile_traces(&traces, &options(&args))?;
    let took = t.elapsed();
    let bytes = compiled.plan.to_bytes();
    write_atomic(&args.output, &bytes)?;
    if !quiet {
        let r = &compiled.report;
        for w in &r.warnings {
            eprintln!("warmstart: warning: {w}");
        }
        for p in &r.passes {
            eprintln!(
                "  {:<32} {:>6} -> {:>6} entries  {:>10} -> {:>10}",
                p.pass,
                p.entries_before,
                p.entries_after,
                human_bytes(p.bytes_before),
                human_bytes(p.bytes_after)
            );
        }
        if r.bytes_unused > 0 {
            eprintln!(
                "warmstart: left out {} the kernel read ahead but no launch used (--keep-unused keeps it)",
                human_bytes(r.bytes_unused)
            );
        }
        if r.files_written > 0 {
            eprintln!(
                "warmstart: left out {} file(s), {}, changed while the launch ran (outputs, logs)",
                r.files_written,
                human_bytes(r.bytes_written)
            );
        }
        if let Some(why) = &r.empty {
            eprintln!("warmstart: the plan is empty: {why}");
        }
        eprintln!(
            "warmstart: plan of {} entries ({} files, {} data, {} metadata) in {} bytes, compiled in {:.1} ms -> {}",
            compiled.plan.entries.len(),
            compiled.plan.files.len(),
            human_bytes(compiled.plan.data_bytes()),
            human_bytes(compiled.plan.meta_bytes()),
            bytes.len(),
            took.as_secs_f64() * 1e3,
            args.output.display()
        );
    }
    Ok(0)
}
