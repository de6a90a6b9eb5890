//! Helpers shared by the mock-backend tests: a plan builder, file
//! identities and the calls worth comparing.
#![allow(dead_code)] // each test file uses its own share

use std::time::Duration;

use warmstart_plan::plan::{Lookup, PlanFile, PlanMeta};
use warmstart_plan::trace::{FileId, NsOpKind};
use warmstart_plan::{Entry, Plan};
use warmstart_replay::mock::{Call, MockBackend};
use warmstart_replay::{MemInfo, Options};

pub const K: u64 = 1024;
pub const M: u64 = 1024 * 1024;
pub const G: u64 = 1024 * M;

pub fn sda() -> u64 {
    libc::makedev(8, 0)
}

pub fn id(ino: u64) -> FileId {
    FileId {
        dev: sda(),
        ino,
        size: 4 * G,
        mtime_ns: 1_000,
        ctime_ns: 2_000,
    }
}

pub fn plan(files: &[(&str, FileId)], lookups: &[(NsOpKind, &str)], entries: Vec<Entry>) -> Plan {
    Plan {
        meta: PlanMeta {
            command: vec!["app".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: files
            .iter()
            .map(|(p, id)| PlanFile {
                path: p.to_string(),
                id: *id,
            })
            .collect(),
        lookups: lookups
            .iter()
            .map(|(kind, p)| Lookup {
                kind: *kind,
                path: p.to_string(),
            })
            .collect(),
        entries,
    }
}

pub fn data(file: u32, offset: u64, len: u64) -> Entry {
    Entry::Data { file, offset, len }
}

pub fn opts(workers: usize) -> Options {
    Options {
        workers,
        queue_depth: 2,
        memory_check_interval: Duration::ZERO,
        ..Options::default()
    }
}

/// The calls that touch files, devices or paths, in order.
pub fn io_calls(b: &MockBackend) -> Vec<Call> {
    b.calls()
        .into_iter()
        .filter(|c| !matches!(c, Call::Memory | Call::IoPriority(_) | Call::Cpus(_)))
        .collect()
}

pub fn prefetch(target: &str, offset: u64, len: u64) -> Call {
    Call::Prefetch {
        target: target.into(),
        offset,
        len,
    }
}

pub fn mem(available: u64) -> MemInfo {
    MemInfo {
        total: 32 * G,
        available,
    }
}

/// Polls `cond` every millisecond until it holds, for at most 10 s (the
/// caller's assertions then say what did not happen).
pub fn wait_until(cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
}
