//! Launch prediction: which programs are likely to start soon.
//!
//! The daemon sees every exec, every boot and every login session. From
//! that history a [`Predictor`] ranks profiles, so that idle time can be
//! spent reading the plans of the launches most likely to come next
//! (startup preloading, as in "On faster application startup times", and
//! the Markov chains of Debian's `preload`).
//!
//! The model is deliberately transparent: every score is the blend of a
//! few probabilities a user can read in `warmstart status` (how often a
//! profile starts, how often it follows the last launch, how often it is
//! among the first launches after a startup), scaled by how useful its
//! earlier preloads turned out to be. Nothing here makes a system call;
//! the daemon feeds events in and reads rankings out, and the tests run
//! the models over recorded and generated histories.

pub mod eval;
pub mod history;
pub mod horizon;
pub mod model;
pub mod usage;

pub use eval::{evaluate, Evaluation};
pub use history::{Event, History, HistoryError, Launch, Startup, StartupKind};
pub use model::{Candidate, ModelKind, Predictor, PredictorConfig, Scores, SOON_RECKONED};
