//! Shared by the attack tests: an allocator that measures what a decode
//! allocates, sample plans and traces, and the mutations applied to them.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use warmstart_plan::container::{self, Kind};
use warmstart_plan::plan::{Lookup, PlanFile, PlanMeta, PLAN_MAJOR, PLAN_MINOR};
use warmstart_plan::trace::{
    Backend, CacheState, EndReason, Extent, FileId, FileTrace, MetaExtent, NamespaceOp, NsOpKind,
    TraceMeta, TraceStats, NEVER_USED, PAGE_SIZE, TRACE_MAJOR, TRACE_MINOR,
};
use warmstart_plan::{Entry, FormatError, Plan, Trace};

/// Counts the bytes live on this thread and their peak, so a test can say
/// how much one decode allocated, whatever other test threads do.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping touches only const-initialized thread-locals, which never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        // SAFETY: the caller's layout, passed on as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`; the caller guarantees `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(delta: isize) {
    // `try_with`: thread-locals are gone while a thread exits.
    let _ = LIVE.try_with(|l| {
        let now = l.get().saturating_add_signed(delta);
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the most bytes it had allocated
/// at once on this thread, above what was live before.
pub fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// The most a decode of an input of `len` bytes may allocate at once. A
/// plan's payload inflates at most about 1,032-fold (deflate's limit),
/// capped by the container at 256 MiB, into a buffer that doubles as it
/// grows (2x). Decoded, each payload byte becomes at most 16 bytes of
/// structures (a 2-byte lookup entry is 24 bytes in memory, a 2-byte
/// lookup 32), in vectors that also double as they grow (another 2x). The
/// bound is that, plus 1 MiB of fixed overhead (the reader's first
/// buffer).
pub fn alloc_bound(len: usize) -> usize {
    let inflated = (len * 1032).min(256 << 20);
    inflated * 2 + inflated * 16 * 2 + (1 << 20)
}

pub fn meta() -> TraceMeta {
    TraceMeta {
        command: vec!["/usr/bin/app".into(), "--flag".into()],
        cwd: "/home/u".into(),
        backend: Backend::Bpf,
        cache: CacheState::Cold,
        end: EndReason::Exited,
        exit_code: Some(0),
        started_unix_ms: 1_700_000_000_000,
        hostname: "host".into(),
    }
}

/// A realistic small trace: a few libraries, metadata, lookups, some
/// pages never used.
pub fn sample_trace() -> Trace {
    let files = (0..6u64)
        .map(|f| FileTrace {
            path: (f != 5).then(|| format!("/usr/lib/x86_64-linux-gnu/lib{f}.so.1")),
            id: FileId {
                dev: 0x10302,
                ino: 1000 + f,
                size: 3 << 20,
                mtime_ns: 1_600_000_000_000_000_000,
                ctime_ns: 1_600_000_000_000_000_000,
            },
            extents: (0..5u64)
                .map(|j| Extent {
                    offset: (j * 9 + f) * PAGE_SIZE,
                    len: (1 + j % 3) * PAGE_SIZE,
                    t_ns: if j == 4 { NEVER_USED + j } else { j * 100 + f },
                    from_storage: j % 2 == 0,
                })
                .collect(),
        })
        .collect();
    Trace {
        meta: meta(),
        files,
        metadata: (0..8u64)
            .map(|m| MetaExtent {
                device: 0x10300,
                offset: (30_000 + m * 7) * PAGE_SIZE,
                len: PAGE_SIZE,
                t_ns: m * 50,
            })
            .collect(),
        namespace_ops: vec![
            NamespaceOp {
                t_ns: 1,
                kind: NsOpKind::Stat,
                path: "/etc/missing.conf".into(),
                result: -2,
            },
            NamespaceOp {
                t_ns: 2,
                kind: NsOpKind::DirRead,
                path: "/usr/share/app".into(),
                result: 0,
            },
        ],
        stats: TraceStats::default(),
    }
}

pub fn sample_plan() -> Plan {
    let files: Vec<PlanFile> = (0..4u64)
        .map(|f| PlanFile {
            path: format!("/usr/lib/lib{f}.so"),
            id: FileId {
                dev: 1,
                ino: 10 + f,
                size: 1 << 20,
                mtime_ns: 5,
                ctime_ns: 6,
            },
        })
        .collect();
    let mut entries = vec![Entry::Lookup { index: 0 }];
    for f in 0..4u32 {
        entries.push(Entry::Meta {
            device: 0x800,
            offset: u64::from(f) << 20,
            len: 4096,
        });
        entries.push(Entry::Data {
            file: f,
            offset: u64::from(f) * 8192,
            len: 65536,
        });
    }
    Plan {
        meta: PlanMeta {
            command: vec!["/usr/bin/app".into()],
            created_unix_ms: 1,
            traces: 2,
            min_traces: 2,
            passes: vec!["combine traces=2 min=2".into(), "used-only".into()],
            sorted: false,
        },
        files,
        lookups: vec![Lookup {
            kind: NsOpKind::Stat,
            path: "/etc/missing".into(),
        }],
        entries,
    }
}

/// A plan file around a raw (not yet deflated) postcard payload.
pub fn plan_file(raw: &[u8]) -> Vec<u8> {
    container::envelope(Kind::Plan, PLAN_MAJOR, PLAN_MINOR, container::deflate(raw))
}

/// A trace file around a raw postcard payload.
pub fn trace_file(raw: &[u8]) -> Vec<u8> {
    container::envelope(Kind::Trace, TRACE_MAJOR, TRACE_MINOR, raw.to_vec())
}

/// SplitMix64: a small deterministic generator, so a failing input can be
/// found again from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break arithmetic and allocation when put in a length,
/// count, offset or size.
pub const NASTY: [u64; 10] = [
    0,
    1,
    4095,
    4096,
    1 << 31,
    1 << 32,
    1 << 40,
    1 << 62,
    u64::MAX - 1,
    u64::MAX,
];

/// Appends `v` as a postcard varint.
pub fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One mutation of `bytes`: bit flips, byte overwrites, truncation,
/// extension, a duplicated or deleted run, or a nasty varint spliced in
/// where a length or count might be.
pub fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    match rng.below(7) {
        0 => {
            for _ in 0..=rng.below(4) {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            if !bytes.is_empty() {
                let i = rng.below(bytes.len());
                bytes[i] = [0, 0x7f, 0x80, 0xff][rng.below(4)];
            }
        }
        2 => {
            let n = rng.below(bytes.len() + 1);
            bytes.truncate(n);
        }
        3 => {
            for _ in 0..=rng.below(16) {
                bytes.push(rng.next() as u8);
            }
        }
        4 => {
            if !bytes.is_empty() {
                let a = rng.below(bytes.len());
                let b = (a + 1 + rng.below(32)).min(bytes.len());
                let run = bytes[a..b].to_vec();
                let at = rng.below(bytes.len());
                bytes.splice(at..at, run);
            }
        }
        5 => {
            if !bytes.is_empty() {
                let a = rng.below(bytes.len());
                let b = (a + 1 + rng.below(16)).min(bytes.len());
                bytes.drain(a..b);
            }
        }
        _ => {
            let at = rng.below(bytes.len() + 1);
            let end = (at + 1 + rng.below(9)).min(bytes.len());
            let mut v = Vec::new();
            varint(&mut v, NASTY[rng.below(NASTY.len())]);
            bytes.splice(at..end, v);
        }
    }
}

/// Decodes `bytes` as a plan and as a trace, the header alone too, and
/// returns whether each was accepted. Panics are the caller's to catch.
pub fn decode_all(bytes: &[u8]) -> [Result<(), FormatError>; 3] {
    [
        Plan::from_bytes(bytes).map(|p| {
            p.check().expect("a decoded plan passes check()");
        }),
        Trace::from_bytes(bytes).map(|t| {
            t.check().expect("a decoded trace passes check()");
        }),
        container::read(&mut &bytes[..]).map(|_| ()),
    ]
}
