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
    let mut traces = Vec::new();
    for p in &args.traces {
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
