//! The residency wait: after issuing, poll what was issued until it is in
//! the page cache or the deadline passes.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use warmstart_plan::Plan;

use super::meta::DevState;
use super::worker::State;
use super::{lock, Engine};
use crate::backend::Backend;
use crate::report::WaitReport;
use crate::ReplayError;

impl<B: Backend> Engine<'_, B> {
    /// The wait phase: poll residency of everything issued, in plan order,
    /// until all of it is cached or the deadline passes.
    pub(super) fn wait(&self, plan: &Plan, state: &State<'_, B>, deadline: Instant) -> WaitReport {
        let mut report = WaitReport::default();
        for (i, slot) in state.files.iter().enumerate() {
            let ranges = std::mem::take(&mut *lock(&slot.issued));
            if ranges.is_empty() {
                continue;
            }
            // Descriptors were closed after their last request; reopen and
            // make sure it is still the same file.
            let pf = &plan.files[i];
            match self.backend.open_file(Path::new(&pf.path)) {
                Ok((h, id)) if id == pf.id => {
                    self.wait_ranges(state, &h, &ranges, deadline, &mut report)
                }
                _ => report.files_unchecked += 1,
            }
        }
        for slot in state.devices.values() {
            let ranges = std::mem::take(&mut *lock(&slot.issued));
            if let DevState::Open(h) = &*lock(&slot.state) {
                self.wait_ranges(state, h, &ranges, deadline, &mut report);
            }
        }
        report
    }

    fn wait_ranges(
        &self,
        state: &State<'_, B>,
        h: &B::Handle,
        ranges: &[(u64, u64)],
        deadline: Instant,
        report: &mut WaitReport,
    ) {
        let mut pending: Vec<(u64, u64)> = merge(ranges);
        // One note per file: its ranges fail for the same reason.
        let mut noted = false;
        // Once the deadline passed or the replay was cancelled, one more
        // pass counts what is resident without waiting.
        let mut last_pass = report.timed_out || self.cancel.load(Ordering::Relaxed);
        loop {
            let mut still = Vec::new();
            for &(offset, len) in &pending {
                match self.backend.residency(h, offset, len) {
                    Ok(r) if r.complete() || last_pass => {
                        report.pages += r.pages;
                        report.resident += r.resident.min(r.pages);
                    }
                    Ok(_) => still.push((offset, len)),
                    Err(e) => {
                        report.errors += 1;
                        let denied = matches!(&e, ReplayError::Residency { source, .. }
                            if source.raw_os_error() == Some(libc::EPERM));
                        if denied {
                            // The same for every file: said once.
                            if !state.residency_denied.swap(true, Ordering::Relaxed) {
                                state.note(
                                    "cannot check page-cache residency: the kernel hides it \
                                     for files this user may not write (run as root)"
                                        .into(),
                                );
                            }
                        } else if !std::mem::replace(&mut noted, true) {
                            state.note(e.to_string());
                        }
                    }
                }
            }
            if still.is_empty() {
                return;
            }
            pending = still;
            let now = Instant::now();
            if self.cancel.load(Ordering::Relaxed) {
                last_pass = true;
            } else if now >= deadline {
                report.timed_out = true;
                last_pass = true;
            } else {
                thread::sleep(self.opts.wait_poll.min(deadline - now));
            }
        }
    }
}

/// Sorts ranges and merges overlapping or touching ones.
pub(super) fn merge(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v = ranges.to_vec();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (o, l) in v {
        match out.last_mut() {
            Some((po, pl)) if *po + *pl >= o => *pl = (*pl).max(o + l - *po),
            _ => out.push((o, l)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_table() {
        type Ranges = Vec<(u64, u64)>;
        let cases: Vec<(Ranges, Ranges)> = vec![
            (vec![], vec![]),
            (vec![(10, 5), (0, 10)], vec![(0, 15)]),
            (vec![(0, 4), (8, 4)], vec![(0, 4), (8, 4)]),
            (vec![(0, 10), (2, 3)], vec![(0, 10)]),
        ];
        for (input, want) in cases {
            assert_eq!(merge(&input), want, "{input:?}");
        }
    }
}
