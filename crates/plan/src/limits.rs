//! What a plan or trace may hold at most, in one place.
//!
//! warmstart runs as root and reads plans and traces that may have been
//! forged or damaged, so everything a file can make the program spend
//! (memory while decoding, requests while replaying, bytes read) is capped.
//! The caps are far above what real launches need: the largest launch
//! measured, GIMP, compiles to about 900 files, 4,100 entries and 250 MiB
//! of data and metadata; LibreOffice to 370 files and 2,700 entries. Each
//! limit leaves room for a thousand times that, or for whole-system startup,
//! while keeping a hostile file from costing more than a bounded amount.
//!
//! They are enforced twice: while decoding (a per-thread budget counts sequence
//! elements as they are read, so a forged count cannot make the decoder
//! allocate past the caps), and by `check()` on the decoded value, which
//! also checks what decoding cannot (sizes, offsets, sums). A value over a
//! limit is reported as [`FormatError::TooLarge`](crate::FormatError)
//! naming the limit and the value.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

/// Longest path: Linux's `PATH_MAX` (4096, with its terminating NUL). The
/// kernel refuses a longer path in any call, so one cannot be replayed.
pub const MAX_PATH_LEN: u64 = 4096;

/// Most files in a plan or a trace: 262,144. GIMP's launch opens about 900
/// files; a whole distribution's `/usr` holds about 300,000. At 64 bytes a
/// file plus its path, the table cannot outgrow a few dozen MiB.
pub const MAX_FILES: u64 = 1 << 18;

/// Most path lookups in a plan or a trace: 262,144, as for files (a launch
/// looks up about as many paths as it opens, negative ones included).
pub const MAX_LOOKUPS: u64 = 1 << 18;

/// Most schedule entries in a plan, or extents (data and metadata) in a
/// trace: 4,194,304. GIMP's plan has about 4,100 entries; a trace that
/// keeps each page at its own time has one extent per page it read, about
/// 60,000 for GIMP's 235 MiB. An entry takes 24 bytes in memory, so the
/// schedule stays under 100 MiB.
pub const MAX_ENTRIES: u64 = 1 << 22;

/// Most bytes of all strings together (paths, the command, pass names):
/// 64 MiB, about a thousand times GIMP's file table.
pub const MAX_STRING_BYTES: u64 = 64 << 20;

/// Most command-line arguments kept with a plan or trace: Linux allows an
/// argument list of about 128 K strings (`MAX_ARG_STRINGS` is larger, but
/// the 2 MiB `ARG_MAX` of the stack limit runs out first).
pub const MAX_ARGS: u64 = 1 << 17;

/// Largest single range, data or metadata: 1 TiB. Beyond any launch's read
/// and beyond a launch that reads a raw block device (`dd if=/dev/sdX` is
/// recorded as metadata), yet replaying one is bounded: the request count
/// is computed arithmetically ([`crate::chunk::request_count`]), never by
/// walking the range.
pub const MAX_RANGE: u64 = 1 << 40;

/// Most bytes of all ranges together: 1 TiB, four thousand times GIMP's
/// 250 MiB. No page cache holds more, so a plan reading more would evict
/// its own beginning before the launch got to it.
pub const MAX_TOTAL_BYTES: u64 = 1 << 40;

/// Largest file size a plan or trace may record: what `off_t` can hold. A
/// larger size cannot be a real file's.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Largest payload the header of a plan file may promise (compressed):
/// 64 MiB. GIMP's plan file is about 100 KB.
pub const MAX_PLAN_PAYLOAD: u64 = 64 << 20;

/// Largest payload the header of a trace file may promise: 1 GiB. A trace
/// at [`MAX_ENTRIES`] extents of about 30 bytes each, with its paths, fits.
pub const MAX_TRACE_PAYLOAD: u64 = 1 << 30;

/// One of the limits above, as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    PathLen,
    Files,
    Lookups,
    Entries,
    StringBytes,
    Args,
    Range,
    TotalBytes,
    FileSize,
    Payload,
}

impl Limit {
    /// The limit's value. [`Limit::Payload`] is the plan's; a trace's is
    /// [`MAX_TRACE_PAYLOAD`].
    pub const fn max(self) -> u64 {
        match self {
            Limit::PathLen => MAX_PATH_LEN,
            Limit::Files => MAX_FILES,
            Limit::Lookups => MAX_LOOKUPS,
            Limit::Entries => MAX_ENTRIES,
            Limit::StringBytes => MAX_STRING_BYTES,
            Limit::Args => MAX_ARGS,
            Limit::Range => MAX_RANGE,
            Limit::TotalBytes => MAX_TOTAL_BYTES,
            Limit::FileSize => MAX_FILE_SIZE,
            Limit::Payload => MAX_PLAN_PAYLOAD,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Limit::PathLen => "path length",
            Limit::Files => "files",
            Limit::Lookups => "lookups",
            Limit::Entries => "entries",
            Limit::StringBytes => "bytes of strings",
            Limit::Args => "command arguments",
            Limit::Range => "bytes of one range",
            Limit::TotalBytes => "bytes of all ranges",
            Limit::FileSize => "file size",
            Limit::Payload => "payload bytes",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Sequence elements read so far in the decode running on this thread, by
/// limit, and the first limit they went past. serde's error type for
/// postcard carries no message, so the decoder leaves the limit here for
/// [`crate::container`] to report.
#[derive(Default)]
struct Counts {
    files: u64,
    lookups: u64,
    entries: u64,
    args: u64,
    exceeded: Option<(Limit, u64)>,
}

thread_local! {
    static BUDGET: RefCell<Option<Counts>> = const { RefCell::new(None) };
}

/// Counting for one decode on this thread: while it lives, sequences marked
/// with the `bounded_*` deserializers are capped; outside one (JSON, tests
/// building values) they decode as plain `Vec`s.
pub(crate) struct Budget(());

impl Budget {
    pub(crate) fn start() -> Budget {
        BUDGET.with(|b| *b.borrow_mut() = Some(Counts::default()));
        Budget(())
    }

    /// The limit the decode went past, if it did.
    pub(crate) fn exceeded(&self) -> Option<(Limit, u64)> {
        BUDGET.with(|b| b.borrow().as_ref().and_then(|c| c.exceeded))
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        BUDGET.with(|b| *b.borrow_mut() = None);
    }
}

/// Counts one more element against `limit`; false once past it.
fn take(limit: Limit) -> bool {
    BUDGET.with(|b| {
        let mut b = b.borrow_mut();
        let Some(c) = b.as_mut() else {
            return true;
        };
        let n = match limit {
            Limit::Files => &mut c.files,
            Limit::Lookups => &mut c.lookups,
            Limit::Args => &mut c.args,
            _ => &mut c.entries,
        };
        *n += 1;
        if *n > limit.max() {
            c.exceeded.get_or_insert((limit, *n));
            return false;
        }
        true
    })
}

struct Bounded<T> {
    limit: Limit,
    marker: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a sequence of at most {} {}",
            self.limit.max(),
            self.limit
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        // The length prefix is what a forged file lies about: reserve only
        // a little, and let the vector grow with the elements really read.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(x) = seq.next_element()? {
            if !take(self.limit) {
                return Err(serde::de::Error::custom(format_args!(
                    "more than {} {}",
                    self.limit.max(),
                    self.limit
                )));
            }
            out.push(x);
        }
        Ok(out)
    }
}

fn bounded<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    limit: Limit,
) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Bounded {
        limit,
        marker: PhantomData,
    })
}

pub(crate) fn bounded_files<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    bounded(d, Limit::Files)
}

pub(crate) fn bounded_lookups<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    bounded(d, Limit::Lookups)
}

/// Plan entries, and a trace's extents of every file and its metadata
/// extents, all counted together.
pub(crate) fn bounded_entries<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    bounded(d, Limit::Entries)
}

/// Command arguments and pass names.
pub(crate) fn bounded_args<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    bounded(d, Limit::Args)
}

/// Checks `value` against `limit`: the value, for the error, if over.
pub(crate) fn within(limit: Limit, value: u64) -> Result<(), (Limit, u64)> {
    if value > limit.max() {
        Err((limit, value))
    } else {
        Ok(())
    }
}
