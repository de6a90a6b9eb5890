//! Adaptive runtime prefetching for data-heavy programs: prefetchd's
//! flashy prefetching (Zhang et al., 2013) on warmstart's recorder events.

pub mod detect;
pub mod feedback;
mod pages;
mod run;

pub use run::{attach, measure_throughput, run, Error, FileReport, Options, Report};
