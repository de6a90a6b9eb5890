//! The one layer between warmstart and the Linux calls it shares across
//! crates: opening a path that root did not create ([`open`]), looking a
//! path up in the kernel's caches alone ([`cached`]), telling
//! whether a file is still the one recorded ([`identity`]), where its
//! blocks are on disk ([`fiemap`]), how much of it is in the page cache
//! ([`residency`]), asking the kernel to read or drop it ([`fadvise`]),
//! and the CPU and I/O priority of the calling thread ([`sched`]).
//!
//! Every function here either takes an open descriptor or opens its path
//! through [`open::open`], so no caller can turn a recorded path that now
//! names a FIFO, a device or a symlink into a blocking or side-effecting
//! open by accident. ([`cached`] takes a path, but opens it with `O_PATH`
//! alone, which runs no driver and waits for no FIFO.)

pub mod cached;
pub mod error;
pub mod fadvise;
pub mod fiemap;
pub mod identity;
pub mod open;
pub mod residency;
pub mod sched;

pub use error::Error;
pub use identity::{FileIdentity, FileKind};
pub use open::{open, OpenOptions, Opened};
