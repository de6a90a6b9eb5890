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
    /// until all of it is cached, the deadline passes, or what is left makes
    /// no progress.
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
                    let what = Waited::File(&pf.path);
                    self.wait_ranges(state, what, &h, &ranges, deadline, &mut report)
                }
                _ => report.files_unchecked += 1,
            }
        }
        for (&device, slot) in &state.devices {
            let ranges = std::mem::take(&mut *lock(&slot.issued));
            if let DevState::Open(h) = &*lock(&slot.state) {
                let what = Waited::Device(device);
                self.wait_ranges(state, what, h, &ranges, deadline, &mut report);
            }
        }
        report
    }

    fn wait_ranges(
        &self,
        state: &State<'_, B>,
        what: Waited<'_>,
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
        // Ranges still absent at the first poll are read through once
        // (see `Backend::read_through`): a page still being read is waited
        // for, not read twice, and a page read-ahead left behind is read.
        // Read-ahead leaves pages behind: a device's, when a filesystem
        // holds its metadata through buffer heads without marking the page
        // up to date; a file's, when a read-ahead does not complete (on
        // the `sd` model's ext4 image it left 113 of clang's 24,631 pages
        // absent, at random and without an I/O error at the block layer).
        // Either way the page stays cached but not up to date, where
        // `WILLNEED` passes it by and polling never sees it arrive. Waiting
        // for a file to stall before reading it cost a fifth of
        // `wait_stall` per such file, one file after another: prefetch-only
        // replays of python-scipy's plan on `sd` then took 3.3 to 32 s
        // (timed out) instead of 2.4 s. A file's ranges that still stall
        // after a fifth of `wait_stall` are read once more: under heavy
        // write-back, pages read at once were found absent again, where
        // the later read alone had made them resident.
        let mut read = false;
        let mut read_on_stall = matches!(what, Waited::File(_));
        // Pages of ranges that completed, and the most resident pages
        // (those plus the pending ranges') seen at a poll, and when.
        let mut done = 0u64;
        let (mut best, mut progress_at) = (0u64, Instant::now());
        // Why this file's wait ended early, for the note naming what was
        // left (once: later files just count what is resident then).
        let mut ended: Option<String> = None;
        loop {
            let mut still = Vec::new();
            let (mut now_resident, mut missing) = (0u64, None);
            for &(offset, len) in &pending {
                match self.backend.residency(h, offset, len) {
                    Ok(r) if r.complete() || last_pass => {
                        report.pages += r.pages;
                        report.resident += r.resident.min(r.pages);
                        done += r.resident.min(r.pages);
                        if !r.complete() {
                            let (n, _) = missing.get_or_insert((0, offset));
                            *n += r.pages - r.resident.min(r.pages);
                        }
                    }
                    Ok(r) => {
                        now_resident += r.resident;
                        still.push((offset, len));
                    }
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
            if let (Some((n, first)), Some(why)) = (missing, &ended) {
                state.note(format!(
                    "residency wait: {n} pages of {what} (the first absent range at byte \
                     {first}) {why}"
                ));
            }
            if still.is_empty() {
                return;
            }
            pending = still;
            if !read {
                read = true;
                self.read_through(state, h, &pending, deadline, report, &mut noted);
                // Poll again at once: the reads have returned.
                continue;
            }
            let now = Instant::now();
            if done + now_resident > best {
                (best, progress_at) = (done + now_resident, now);
            }
            if self.cancel.load(Ordering::Relaxed) {
                last_pass = true;
            } else if now >= deadline {
                report.timed_out = true;
                last_pass = true;
                ended = Some("were still absent when the wait timed out".into());
            } else if now.duration_since(progress_at) >= self.opts.wait_stall / 5
                && std::mem::replace(&mut read_on_stall, false)
            {
                self.read_through(state, h, &pending, deadline, report, &mut noted);
                progress_at = Instant::now();
            } else if now.duration_since(progress_at) >= self.opts.wait_stall {
                report.stalled = true;
                last_pass = true;
                ended = Some(format!(
                    "stayed absent for {:?} without progress; the wait gave up on them",
                    self.opts.wait_stall
                ));
            } else {
                thread::sleep(self.opts.wait_poll.min(deadline - now));
            }
        }
    }

    /// Reads `ranges` through the page cache (see `Backend::read_through`),
    /// until the deadline passes or the replay is cancelled.
    fn read_through(
        &self,
        state: &State<'_, B>,
        h: &B::Handle,
        ranges: &[(u64, u64)],
        deadline: Instant,
        report: &mut WaitReport,
        noted: &mut bool,
    ) {
        for &(offset, len) in ranges {
            if Instant::now() >= deadline || self.cancel.load(Ordering::Relaxed) {
                return;
            }
            report.ranges_read += 1;
            if let Err(e) = self.backend.read_through(h, offset, len) {
                report.errors += 1;
                if !std::mem::replace(noted, true) {
                    state.note(e.to_string());
                }
            }
        }
    }
}

/// What a residency wait is for, as its notes name it.
#[derive(Clone, Copy)]
enum Waited<'a> {
    File(&'a str),
    Device(u64),
}

impl std::fmt::Display for Waited<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waited::File(p) => f.write_str(p),
            Waited::Device(d) => write!(f, "block device {}", crate::error::dev_name(*d)),
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
