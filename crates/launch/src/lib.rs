//! The launch manager: FAST's cycle (§5.4, Table 2) without a kernel patch.
//!
//! learning ──(N_rawseq traces)──> compile ──> prefetching ──(miss ratio >
//! R_miss, or stale files)──> learning again. Launches too small to benefit
//! are left alone. Each prefetching launch is audited: cheaply by the
//! block-input count of the application's own process tree (what it still
//! had to read from storage itself), or exactly by the recorder (`audit`).

pub mod daemon;
pub mod device;
pub mod history;
pub mod install;
mod manager;
pub mod preload;
pub mod startup;
pub mod store;

pub use manager::{
    compile_traces, mark_relearn, profile_name, profile_name_for, run, run_without_recorder,
    Config, LaunchReport, Strategy, StrategyChoice,
};
pub use store::{default_state_dir, Phase, Profile, Store};

use std::path::{Path, PathBuf};

/// What went wrong managing a launch. The launch itself still happens
/// whenever possible; these are the cases where it cannot.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("profile {path} is corrupt ({why}); remove it with `warmstart forget`")]
    CorruptProfile { path: PathBuf, why: String },
    #[error("invalid profile name {0:?}: use letters, digits, '-', '_' or '.'")]
    BadName(String),
    #[error(transparent)]
    Record(#[from] warmstart_record::Error),
    #[error("cannot start {cmd:?}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// For a command that could not be started, the status a shell
    /// reports: 127 when it was not found, 126 when it was found but could
    /// not be run. `None` for the other errors.
    pub fn shell_code(&self) -> Option<i32> {
        match self {
            Error::Spawn { source, .. } => Some(warmstart_record::spawn::shell_code(source)),
            Error::Record(e) => e.shell_code(),
            _ => None,
        }
    }
}
