//! What compiling did: per-pass sizes, dropped bytes by reason, why a plan
//! is empty, and warnings about the input.

use std::fmt;

use crate::plan::Plan;
use crate::trace::{Backend, Trace};

/// Why a compiled plan has no entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmptyReason {
    /// The traces hold no file data with a path and no metadata.
    NoAccesses,
    /// Nothing appeared in enough traces.
    NothingInCommon { min_traces: u32 },
    /// Everything was under an excluded prefix.
    AllExcluded,
    /// The launch needs too little to be worth prefetching.
    SmallLaunch { bytes: u64, min_bytes: u64 },
}

impl fmt::Display for EmptyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmptyReason::NoAccesses => {
                f.write_str("the traces recorded no named file data and no metadata")
            }
            EmptyReason::NothingInCommon { min_traces } => {
                write!(f, "no page appeared in {min_traces} or more traces")
            }
            EmptyReason::AllExcluded => f.write_str("every file is under an excluded path"),
            EmptyReason::SmallLaunch { bytes, min_bytes } => write!(
                f,
                "the launch reads {bytes} bytes, less than the {min_bytes} worth prefetching"
            ),
        }
    }
}

/// Something about the input the user should know; compiling went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Traces of different commands were combined (trace indexes as given).
    MixedCommands {
        trace: usize,
        command: Vec<String>,
        newest: Vec<String>,
    },
    /// A trace lost kernel events, so it may lack accesses.
    DroppedEvents { trace: usize, drops: u64 },
    /// A trace from a residency snapshot: its order is not the launch's.
    Unordered { trace: usize },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::MixedCommands {
                trace,
                command,
                newest,
            } => write!(
                f,
                "trace {trace} is of {command:?}, the newest of {newest:?}; combined anyway"
            ),
            Warning::DroppedEvents { trace, drops } => {
                write!(f, "trace {trace} lost {drops} events and may lack accesses")
            }
            Warning::Unordered { trace } => write!(
                f,
                "trace {trace} is a residency snapshot: its order is approximate"
            ),
        }
    }
}

/// The schedule's size before and after one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// As in [`PlanMeta::passes`](crate::plan::PlanMeta::passes).
    pub pass: String,
    pub entries_before: usize,
    pub entries_after: usize,
    /// Data and metadata bytes read.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What compiling did, for the user and for tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileReport {
    pub passes: Vec<PassReport>,
    /// Distinct data and metadata bytes in at least one trace.
    pub bytes_seen: u64,
    /// Of those, bytes in fewer than `min_traces` traces: dropped.
    pub bytes_uncommon: u64,
    /// Data bytes of files without a path, summed over traces: dropped,
    /// since replay opens files by path.
    pub bytes_unnamed: u64,
    pub files_unnamed: u32,
    /// Bytes no longer valid under the newest identity: past the end of the
    /// file, or of a path whose inode a newer trace gives another path.
    pub bytes_stale: u64,
    pub files_stale: u32,
    /// Kept bytes of files changed while their newest launch ran (their
    /// ctime is later than its start): outputs and logs, which the next
    /// launch finds changed. Dropped.
    pub bytes_written: u64,
    pub files_written: u32,
    /// Kept data bytes no launch used (only read ahead by the kernel),
    /// dropped since [`CompileOptions::unused`](super::CompileOptions::unused) was off.
    pub bytes_unused: u64,
    /// Kept bytes of files under excluded prefixes.
    pub bytes_excluded: u64,
    pub files_excluded: u32,
    /// Bytes the plan reads that no kept page needs: holes range merge fills.
    pub bytes_holes: u64,
    /// Exec/open/stat/access lookups left out because the path is a file the
    /// plan reads, and opening it for the read repeats the lookup.
    pub lookups_implied: u32,
    /// Set when the plan is empty.
    pub empty: Option<EmptyReason>,
    pub warnings: Vec<Warning>,
}

/// A plan and how it was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub plan: Plan,
    pub report: CompileReport,
}

/// A pass that reorders or adds entries without reading different bytes.
pub(super) fn pass_same(
    pass: String,
    entries_before: usize,
    entries_after: usize,
    bytes: u64,
) -> PassReport {
    PassReport {
        pass,
        entries_before,
        entries_after,
        bytes_before: bytes,
        bytes_after: bytes,
    }
}

pub(super) fn warnings(traces: &[Trace]) -> Vec<Warning> {
    let newest = &traces[traces.len() - 1].meta.command;
    let mut out = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        if t.meta.command != *newest {
            out.push(Warning::MixedCommands {
                trace: i,
                command: t.meta.command.clone(),
                newest: newest.clone(),
            });
        }
        if t.stats.drops > 0 {
            out.push(Warning::DroppedEvents {
                trace: i,
                drops: t.stats.drops,
            });
        }
        if t.meta.backend == Backend::Mincore {
            out.push(Warning::Unordered { trace: i });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::trace::Backend;

    #[test]
    fn warnings_table() {
        let mut other = t().file("/a", 1, &[(0, 1, 0)]).done();
        other.meta.command = vec!["other".into()];
        other.stats.drops = 3;
        let mut snapshot = t().file("/a", 1, &[(0, 1, 0)]).done();
        snapshot.meta.backend = Backend::Mincore;
        let c = run(&[other, snapshot], &plain());
        assert_eq!(
            c.report.warnings,
            vec![
                Warning::MixedCommands {
                    trace: 0,
                    command: vec!["other".into()],
                    newest: vec!["app".into()],
                },
                Warning::DroppedEvents { trace: 0, drops: 3 },
                Warning::Unordered { trace: 1 },
            ]
        );
        assert_eq!(c.plan.meta.command, vec!["app".to_string()]);
    }
}
