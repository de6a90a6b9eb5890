//! The launch-wait tracer (`waits.bpf.c`): who inserted each page a
//! launch touched, and how long the launch's threads slept for pages.
//! Loaded only for `warmstart run --breakdown`; it shares nothing with the
//! recorder, so recordings cost the same whether or not it exists.

use std::mem::MaybeUninit;
use std::sync::mpsc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBuffer, RingBufferBuilder};

use crate::{bpf_err, probe, Error};

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/waits.skel.rs"));
}

use skel::{WaitsSkel, WaitsSkelBuilder};

/// What a [`WaitEvent`] says (`enum wt_kind` in waits.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitKind {
    /// Pages inserted into the page cache by a task of the launch.
    AddLaunch,
    /// Pages inserted by a thread of the replay.
    AddReplay,
    /// read(): pages looked up, after any wait for them.
    Get,
    /// Fault-around: cached, uptodate pages mapped.
    Map,
    /// A fault on a file mapping, before any wait.
    Fault,
    /// A launch thread off-CPU in D state from `ts_ns` to `end_ns`;
    /// `stack`: its kernel stack's id ([`WaitTracer::stack`]).
    Sleep { end_ns: u64, stack: Option<u32> },
    /// A launch process exec'd `dev`/`ino`.
    Exec,
    /// A launch process forked process `child`.
    Fork { child: u32 },
    /// A launch process ended.
    Exit,
    /// A launch thread preempted: runnable but off-CPU from `ts_ns` to
    /// `end_ns`; `by_replay`: a replay thread took its CPU.
    Runnable { end_ns: u64, by_replay: bool },
}

/// One record of the tracer. `ts_ns` is CLOCK_MONOTONIC, `dev` the
/// kernel's encoding (major << 20 | minor); pages are `index ..
/// index+count` of (dev, ino).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitEvent {
    pub kind: WaitKind,
    pub pid: u32,
    pub tgid: u32,
    pub ts_ns: u64,
    pub dev: u32,
    pub ino: u64,
    pub index: u64,
    pub count: u64,
}

impl WaitEvent {
    fn decode(data: &[u8]) -> Option<WaitEvent> {
        if data.len() < std::mem::size_of::<skel::types::wt_ev>() {
            return None;
        }
        // SAFETY: the length was checked; wt_ev is a plain C struct of
        // integers, valid for any bit pattern; read_unaligned copes with
        // the ring buffer's alignment.
        let e: skel::types::wt_ev = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
        let kind = match e.kind {
            1 => WaitKind::AddLaunch,
            2 => WaitKind::AddReplay,
            3 => WaitKind::Get,
            4 => WaitKind::Map,
            5 => WaitKind::Fault,
            6 => WaitKind::Sleep {
                end_ns: e.count,
                stack: e.index.checked_sub(1).map(|i| i as u32),
            },
            7 => WaitKind::Exec,
            8 => WaitKind::Fork {
                child: e.index as u32,
            },
            9 => WaitKind::Exit,
            10 => WaitKind::Runnable {
                end_ns: e.count,
                by_replay: e.index != 0,
            },
            _ => return None,
        };
        Some(WaitEvent {
            kind,
            pid: e.pid,
            tgid: e.tgid,
            ts_ns: e.ts_ns,
            dev: e.dev,
            ino: e.ino,
            index: e.index,
            count: e.count,
        })
    }
}

/// A loaded and attached launch-wait tracer. Dropping it detaches it.
pub struct WaitTracer {
    skel: WaitsSkel<'static>,
    ring: RingBuffer<'static>,
    rx: mpsc::Receiver<WaitEvent>,
}

impl WaitTracer {
    /// Loads and attaches the tracer; insertions by `replay_tgid`'s
    /// threads are the replay's. Nothing of a launch is recorded until its
    /// root is [`track`](Self::track)ed.
    pub fn start(replay_tgid: u32) -> Result<Self, Error> {
        if !probe::privileged() {
            return Err(Error::permission());
        }
        // The open object must outlive the skeleton, which borrows it; one
        // tracer per breakdown launch, so leaking it is the simple, sound
        // choice (as for the recorder).
        let obj: &'static mut MaybeUninit<libbpf_rs::OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let log = crate::loadlog::Capture::start();
        let kernel = crate::Kernel::running();
        let mut open = WaitsSkelBuilder::default()
            .open(obj)
            .map_err(crate::load_err("open", &log))?;
        open.maps
            .rodata_data
            .as_deref_mut()
            .expect("waits.bpf.c has read-only data")
            .replay_tgid = replay_tgid;
        for mut prog in open.open_object_mut().progs_mut() {
            let section = prog.section().to_string_lossy().into_owned();
            let name = prog.name().to_string_lossy().into_owned();
            if !kernel.wants(&name, false) {
                prog.set_autoload(false);
                continue;
            }
            if !probe::hook_available(&section) {
                return Err(Error::MissingTracepoint(section));
            }
        }
        let mut skel = open.load().map_err(crate::load_err("load", &log))?;
        skel.attach().map_err(crate::load_err("attach", &log))?;
        drop(log);
        let (tx, rx) = mpsc::channel();
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, move |data: &[u8]| {
                if let Some(ev) = WaitEvent::decode(data) {
                    let _ = tx.send(ev);
                }
                0
            })
            .map_err(bpf_err("ring buffer"))?;
        let ring = builder.build().map_err(bpf_err("ring buffer"))?;
        Ok(Self { skel, ring, rx })
    }

    /// Adds a process (tgid) to the launch; its future children follow.
    pub fn track(&self, tgid: u32) -> Result<(), Error> {
        self.skel
            .maps
            .tracked
            .update(&tgid.to_ne_bytes(), &[1], MapFlags::ANY)
            .map_err(bpf_err("map update"))
    }

    /// Waits up to `timeout`, then appends every record written meanwhile
    /// (records are written without waking the reader).
    pub fn poll(&self, timeout: Duration, out: &mut Vec<WaitEvent>) -> Result<(), Error> {
        match self.ring.poll(timeout) {
            Err(e) if matches!(e.kind(), libbpf_rs::ErrorKind::Interrupted) => {}
            r => r.map_err(bpf_err("poll"))?,
        }
        self.drain(out)
    }

    /// Appends everything still in the ring buffer.
    pub fn drain(&self, out: &mut Vec<WaitEvent>) -> Result<(), Error> {
        self.ring.consume().map_err(bpf_err("consume"))?;
        out.extend(self.rx.try_iter());
        Ok(())
    }

    /// The kernel stack (return addresses, innermost first) of a sleep.
    pub fn stack(&self, id: u32) -> Option<Vec<u64>> {
        let v = self
            .skel
            .maps
            .stacks
            .lookup(&id.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        Some(
            v.chunks_exact(8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .take_while(|&a| a != 0)
                .collect(),
        )
    }

    /// Records the kernel dropped because the ring buffer was full.
    pub fn drops(&self) -> u64 {
        crate::sum_percpu(&self.skel.maps.drops)
    }
}
