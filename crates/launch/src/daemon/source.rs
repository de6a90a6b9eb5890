//! Where the daemon's events come from: the BPF recorder when the daemon
//! runs, nothing when it cannot start (the daemon stays up for what needs
//! no events), a scripted fake in the event loop's tests.

use std::time::Duration;

use warmstart_bpf::Event;

use super::policy::QuietExe;
use crate::Error;

/// Where the daemon's events come from, and how it tells the kernel side
/// which processes to follow.
pub(crate) trait EventSource {
    /// Waits up to `timeout` for events and appends them to `out`. An
    /// exec ends a batch (a launch is decided before the pages after it).
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error>;
    /// Follows `tgid` and its future children: their pages and path
    /// operations too if `pages`, else only the process tree.
    fn track(&mut self, tgid: u32, pages: bool);
    /// Stops following `tgid` (its future children are not followed).
    fn untrack(&mut self, tgid: u32);
    /// Records the kernel side had to drop.
    fn drops(&self) -> u64;
    /// Leaves a program alone for `hold` when a process nobody follows
    /// execs it ([`QuietExe`]).
    fn quiet(&mut self, q: &QuietExe, hold: Duration);
    /// Forgets every quiet program.
    fn clear_quiet(&mut self);
    /// Whether quiet programs are left alone now.
    fn set_quiet(&mut self, on: bool);
    /// Execs left alone because their program was quiet.
    fn quieted(&self) -> u64;
}

impl EventSource for warmstart_bpf::Recorder {
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        warmstart_bpf::Recorder::poll(self, timeout, out)
            .map_err(|e| warmstart_record::Error::from(e).into())
    }

    fn track(&mut self, tgid: u32, pages: bool) {
        let _ = if pages {
            warmstart_bpf::Recorder::track(self, tgid)
        } else {
            self.track_tree_only(tgid)
        };
    }

    fn untrack(&mut self, tgid: u32) {
        warmstart_bpf::Recorder::untrack(self, tgid);
    }

    fn drops(&self) -> u64 {
        warmstart_bpf::Recorder::drops(self)
    }

    fn quiet(&mut self, q: &QuietExe, hold: Duration) {
        // Best effort: a full map only costs the wake-ups it would save.
        let _ = self.quiet_program(q.dev, q.ino, q.name.as_deref(), hold);
    }

    fn clear_quiet(&mut self) {
        warmstart_bpf::Recorder::clear_quiet(self);
    }

    fn set_quiet(&mut self, on: bool) {
        let _ = warmstart_bpf::Recorder::set_quiet(self, on);
    }

    fn quieted(&self) -> u64 {
        warmstart_bpf::Recorder::quieted(self)
    }
}

/// No recorder: the kernel refused it. Polls only wait, so that the loop
/// still runs its timers (foresight, saving), and nothing is followed.
pub(crate) struct NoRecorder;

impl EventSource for NoRecorder {
    fn poll(&mut self, timeout: Duration, _out: &mut Vec<Event>) -> Result<(), Error> {
        std::thread::sleep(timeout);
        Ok(())
    }
    fn track(&mut self, _tgid: u32, _pages: bool) {}
    fn untrack(&mut self, _tgid: u32) {}
    fn drops(&self) -> u64 {
        0
    }
    fn quiet(&mut self, _q: &QuietExe, _hold: Duration) {}
    fn clear_quiet(&mut self) {}
    fn set_quiet(&mut self, _on: bool) {}
    fn quieted(&self) -> u64 {
        0
    }
}

impl EventSource for Box<dyn EventSource> {
    fn poll(&mut self, timeout: Duration, out: &mut Vec<Event>) -> Result<(), Error> {
        (**self).poll(timeout, out)
    }
    fn track(&mut self, tgid: u32, pages: bool) {
        (**self).track(tgid, pages)
    }
    fn untrack(&mut self, tgid: u32) {
        (**self).untrack(tgid)
    }
    fn drops(&self) -> u64 {
        (**self).drops()
    }
    fn quiet(&mut self, q: &QuietExe, hold: Duration) {
        (**self).quiet(q, hold)
    }
    fn clear_quiet(&mut self) {
        (**self).clear_quiet()
    }
    fn set_quiet(&mut self, on: bool) {
        (**self).set_quiet(on)
    }
    fn quieted(&self) -> u64 {
        (**self).quieted()
    }
}
