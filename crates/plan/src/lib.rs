//! warmstart's pure core: the trace model and file format, plans and the
//! passes that compile traces into plans, and their validation. Nothing in
//! this crate makes a system call, so all of it is tested without root.
//! What a plan or trace may hold is capped in [`limits`], checked on every
//! decode; [`chunk`] counts a range's prefetch requests arithmetically.

pub mod chunk;
pub mod compile;
pub mod container;
pub mod limits;
pub mod path;
pub mod trace;

pub use compile::{CompileError, CompileOptions, CompileReport, Compiled};
pub use container::{FormatError, Header};
pub use limits::Limit;
pub use trace::{Trace, TraceBuilder};
pub mod plan;

pub use plan::{Entry, Plan};
