//! `warmstart run --breakdown`: the inputs of the page classification
//! ([`warmstart_record::breakdown`]) from this launch's plan, its replay's
//! request log and its audit trace.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use warmstart_plan::trace::Trace;
use warmstart_plan::{Entry, Plan};
use warmstart_record::breakdown::{classify, Breakdown, Inputs, Key, PlanPages, Request, SleepWhy};
use warmstart_record::kallsyms::{sleep_why, Kallsyms};
use warmstart_record::resolve::{Class, Classifier};
use warmstart_record::waits::Collected;
use warmstart_replay::IssuedRequest;

/// The plan's pages, keyed as the classification keys events.
fn plan_pages(plan: &Plan) -> PlanPages {
    let mut pages = PlanPages::default();
    for e in &plan.entries {
        match *e {
            Entry::Data { file, offset, len } => {
                let f = &plan.files[file as usize];
                pages.add((f.id.dev, f.id.ino), Some(&f.path), offset, len);
            }
            Entry::Meta {
                device,
                offset,
                len,
            } => pages.add((device, 0), None, offset, len),
            Entry::Lookup { .. } => {}
        }
    }
    pages
}

/// Classifies the launch's pages. `issued` is the replay's request log,
/// `trace` the launch's audit trace (it names files the plan does not).
pub(super) fn build(
    plan: &Plan,
    collected: &Collected,
    issued: &[IssuedRequest],
    trace: Option<&Trace>,
) -> Breakdown {
    let pages = plan_pages(plan);
    let requests: Vec<Request> = issued
        .iter()
        .filter_map(|q| {
            let f = plan.files.get(q.file as usize)?;
            Some(Request::of_bytes(
                (f.id.dev, f.id.ino),
                q.offset,
                q.len,
                q.t_ns,
            ))
        })
        .collect();
    let sizes: HashMap<Key, u64> = plan
        .files
        .iter()
        .map(|f| ((f.id.dev, f.id.ino), f.id.size))
        .chain(
            trace
                .into_iter()
                .flat_map(|t| &t.files)
                .map(|f| ((f.id.dev, f.id.ino), f.id.size)),
        )
        .collect();
    let names: HashMap<Key, String> = trace
        .into_iter()
        .flat_map(|t| &t.files)
        .filter_map(|f| Some(((f.id.dev, f.id.ino), f.path.clone()?)))
        .collect();
    // Block-device mappings (metadata) are told from files as the
    // recorder tells them.
    let classifier = Classifier::new(Path::new("/"));
    let key_of = |dev: u32, ino: u64| match classifier.classify(u64::from(dev), ino) {
        Class::Data { dev } => (dev, ino),
        Class::Meta { device } => (device, 0),
    };
    // What each sleep was for, from its kernel stack; without kallsyms
    // every sleep is taken as one for a page.
    let sleeps: HashMap<u32, SleepWhy> = match Kallsyms::load() {
        Some(k) => collected
            .stacks
            .iter()
            .map(|(&id, frames)| (id, sleep_why(frames.iter().filter_map(|&a| k.name(a)))))
            .collect(),
        None => HashMap::new(),
    };
    let own_exe = std::fs::metadata("/proc/self/exe")
        .ok()
        .map(|m| (m.dev(), m.ino()));
    classify(&Inputs {
        own_exe,
        sleeps: &sleeps,
        sizes: &sizes,
        events: &collected.events,
        plan: &pages,
        requests: &requests,
        names: &names,
        key_of: &key_of,
        drops: collected.drops,
    })
}
