//! Learning: recording a launch, keeping its trace, compiling the
//! profile's traces into its plan, and sending a profile back to learning.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use warmstart_plan::compile::{compile, CompileOptions, Compiled};
use warmstart_plan::{Plan, Trace};
use warmstart_record::Exit;

use super::warm::save_warm_check;
use super::{Config, LaunchReport};
use crate::store::{self, Phase, Profile, Store};
use crate::Error;

/// Compiles traces with FIEMAP available for the sorted order.
pub fn compile_traces(
    traces: &[Trace],
    opts: &CompileOptions,
) -> Result<Compiled, warmstart_plan::compile::CompileError> {
    let mapper = warmstart_sys::fiemap::PhysicalMap::default();
    let mut compiled = compile(traces, opts, &|f, off| mapper.physical(&f.path, off))?;
    compiled.plan.meta.created_unix_ms = store::now_ms();
    Ok(compiled)
}

pub(crate) fn load_plan(store: &Store, name: &str) -> Result<Plan, String> {
    let p = store.plan_path(name);
    let bytes = std::fs::read(&p).map_err(|e| format!("plan {} unreadable: {e}", p.display()))?;
    Plan::from_bytes(&bytes).map_err(|e| format!("plan {} rejected: {e}", p.display()))
}

/// A relearning profile's previous plan, if it has one that still reads.
pub(crate) fn load_previous_plan(store: &Store, name: &str) -> Option<Plan> {
    let bytes = std::fs::read(store.previous_plan_path(name)).ok()?;
    Plan::from_bytes(&bytes).ok()
}

/// Sends a profile back to learning. With `keep_plan` its plan stays, as
/// the previous plan, to prefetch with while the new launches are recorded:
/// the replay skips the files that changed, and the recording still sees
/// every page a launch uses, prefetched or not. A plan that could not be
/// read is not kept.
pub(crate) fn relearn(
    prof: &mut Profile,
    store: &Store,
    why: String,
    keep_plan: bool,
    report: &mut LaunchReport,
) {
    for t in prof.traces.drain(..) {
        let _ = std::fs::remove_file(store.trace_path(&prof.name, &t));
    }
    let _ = std::fs::remove_file(store.warm_check_path(&prof.name));
    let (plan, previous) = (
        store.plan_path(&prof.name),
        store.previous_plan_path(&prof.name),
    );
    if !(keep_plan && std::fs::rename(&plan, &previous).is_ok()) {
        let _ = std::fs::remove_file(&plan);
        let _ = std::fs::remove_file(&previous);
    }
    prof.plan_bytes = None;
    prof.phase = Phase::Learning;
    prof.relearned += 1;
    prof.note = Some(format!("relearning: {why}"));
    report.relearn_reason = Some(why);
}

/// Sends profile `name` back to learning if it is prefetching, keeping its
/// plan to prefetch the unchanged files with meanwhile (`warmstart
/// changed`, after a package upgrade replaced some of its files). Returns
/// whether it was prefetching.
pub fn mark_relearn(store: &Store, name: &str, why: &str) -> Result<bool, Error> {
    let Some(mut prof) = store.load(name)? else {
        return Ok(false);
    };
    if prof.phase != Phase::Prefetching {
        return Ok(false);
    }
    let mut report = LaunchReport::new(name, prof.phase);
    relearn(&mut prof, store, why.to_string(), true, &mut report);
    prof.audit_next = false;
    store.save(&mut prof)?;
    Ok(true)
}

/// Keeps a trace in the profile; compiles once there are enough.
pub(crate) fn add_trace(
    trace: &Trace,
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<(), Error> {
    let file = format!("trace-{}", prof.next_trace);
    prof.next_trace += 1;
    let dir = store.dir(&prof.name);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    store::write_atomic(&store.trace_path(&prof.name, &file), &trace.to_bytes())?;
    prof.traces.push(file);
    // Keep only the newest N_rawseq traces: older ones describe an older app.
    while prof.traces.len() > cfg.nrawseq.max(1) as usize {
        let old = prof.traces.remove(0);
        let _ = std::fs::remove_file(store.trace_path(&prof.name, &old));
    }
    if prof.traces.len() < cfg.nrawseq.max(1) as usize {
        prof.note = Some(format!(
            "learning: {} of {} launches recorded",
            prof.traces.len(),
            cfg.nrawseq
        ));
        return Ok(());
    }
    let mut traces = Vec::new();
    let mut unreadable = Vec::new();
    for (name, (p, t)) in prof
        .traces
        .clone()
        .into_iter()
        .zip(read_traces(store, prof))
    {
        match t {
            Ok(t) => traces.push(t),
            Err(why) => {
                eprintln!("warmstart: ignoring trace {}: {why}", p.display());
                unreadable.push(name);
            }
        }
    }
    // No longer listed: the profile's traces are the ones it can read.
    prof.traces.retain(|t| !unreadable.contains(t));
    compile_profile(&traces, store, prof, cfg, report)
}

/// The profile's traces, each with its path; `None` where one cannot be
/// read or decoded.
pub(super) fn read_traces(store: &Store, prof: &Profile) -> Vec<(PathBuf, Result<Trace, String>)> {
    prof.traces
        .iter()
        .map(|t| {
            let p = store.trace_path(&prof.name, t);
            let trace = std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| Trace::from_bytes(&b).map_err(|e| e.to_string()));
            (p, trace)
        })
        .collect()
}

/// Compiles `traces` into the profile's plan (or finds the launch not
/// worth one).
pub(super) fn compile_profile(
    traces: &[Trace],
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<(), Error> {
    let mut compiled = match compile_traces(traces, &cfg.compile) {
        Ok(c) => c,
        Err(e) => {
            prof.note = Some(format!("compile failed: {e}"));
            return Ok(());
        }
    };
    // For a device that seeks, the physical order (FAST's sorted
    // prefetch), which the sorted strategy reads with the program held
    // and the daemon beside it: on the hdd model `run` captured 54% of
    // the gap over the suite and the daemon 57%, against -1% and 3% with
    // plans in first-use order.
    if !cfg.compile.sorted
        && compiled.report.empty.is_none()
        && super::prefetch::strategy(&compiled.plan, store, cfg) == super::Strategy::Sorted
    {
        let opts = CompileOptions {
            sorted: true,
            ..cfg.compile.clone()
        };
        if let Ok(c) = compile_traces(traces, &opts) {
            compiled = c;
        }
    }
    if let Some(reason) = &compiled.report.empty {
        // Nothing of an earlier plan may stay behind (a plan compiled
        // again can come out empty: see `judge`).
        for p in [
            store.previous_plan_path(&prof.name),
            store.plan_path(&prof.name),
            store.warm_check_path(&prof.name),
        ] {
            let _ = std::fs::remove_file(p);
        }
        prof.plan_bytes = None;
        prof.phase = Phase::Ignored;
        prof.note = Some(format!("not prefetched: {reason:?}"));
        report.compiled = prof.note.clone();
        return Ok(());
    }
    let bytes = compiled.plan.to_bytes();
    store::write_atomic(&store.plan_path(&prof.name), &bytes)?;
    save_warm_check(store, &prof.name, &compiled.plan);
    let _ = std::fs::remove_file(store.previous_plan_path(&prof.name));
    prof.plan_bytes = Some(bytes.len() as u64);
    prof.phase = Phase::Prefetching;
    prof.note = Some(format!(
        "plan: {} entries, {} files, {} bytes to read",
        compiled.plan.entries.len(),
        compiled.plan.files.len(),
        compiled.plan.data_bytes() + compiled.plan.meta_bytes()
    ));
    report.compiled = prof.note.clone();
    Ok(())
}

pub(super) fn learn(
    argv: &[OsString],
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
    report: &mut LaunchReport,
) -> Result<Exit, Error> {
    let recorded = match warmstart_record::record(argv, &cfg.record, |_| {}) {
        Ok(r) => r,
        Err(e @ warmstart_record::Error::Spawn { .. }) => return Err(e.into()),
        // Nothing has run yet: the launch goes on, unrecorded.
        Err(e) => return unrecorded(argv, &e, store, prof, cfg),
    };
    for why in &recorded.fallbacks {
        eprintln!("warmstart: recorder fell back from {why}");
    }
    if let Some(why) = &recorded.failed {
        eprintln!("warmstart: recording stopped early ({why}); this launch is not learned");
    } else if let Err(e) = add_trace(&recorded.trace, store, prof, cfg, report) {
        // Compiling happens while the application goes on running. A
        // failure here costs the profile a trace, never the launch its
        // exit status.
        eprintln!("warmstart: could not keep the trace: {e}");
    }
    recorded.wait().map_err(|e| Error::io(Path::new("wait"), e))
}

/// A launch to learn when no recorder can start (a kernel it does not
/// support, a missing privilege): one line on stderr, and the command runs
/// as it would without warmstart, in place of this process where it may
/// (its exit status, signals and terminal are then its own). The profile
/// keeps why, for `status`; plans already learned still prefetch.
fn unrecorded(
    argv: &[OsString],
    why: &warmstart_record::Error,
    store: &Store,
    prof: &mut Profile,
    cfg: &Config,
) -> Result<Exit, Error> {
    eprintln!("warmstart: cannot record this launch ({why}); running it without learning");
    prof.note = Some(format!("not learned: no recorder ({why})"));
    if cfg.exec_in_place {
        let _ = store.save(prof);
        let source = warmstart_record::exec_in_place(None, argv);
        return Err(Error::Spawn {
            cmd: warmstart_record::argv_text(argv).join(" "),
            source,
        });
    }
    Ok(super::plain_launch(argv)?.0)
}
