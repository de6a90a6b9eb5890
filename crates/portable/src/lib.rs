//! Plans that travel between machines with the same files.
//!
//! A plan names its files by `(dev, inode)` identities that mean nothing
//! on another machine, or even on this one after the files are copied
//! anew. A *portable plan* names them by content instead: path, size, and a
//! SHA-256 of exactly the byte ranges the plan reads (plus the ELF
//! build-id, where there is one, to say *why* a file differs). Importing
//! checks every file against the local one, drops the entries of files
//! that differ, and binds the rest to the local inodes, giving a plan the
//! launch manager uses from its first launch.
//!
//! Metadata entries (block offsets on one device) are dropped at export:
//! another file system lays its metadata out elsewhere. Path lookups are
//! kept only inside directories that hold a file that passed the check.
//!
//! [`oci`] stores the exported file as an OCI artifact in a registry.

pub mod format;
pub mod identity;
pub mod oci;

pub use format::{export, import, Dropped, Imported, PortableFile, PortablePlan, Why};
pub use oci::{Client, Reference};

use std::path::PathBuf;

/// What went wrong exporting, importing or moving a portable plan.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error("not a warmstart portable plan: {0}")]
    Format(String),
    #[error("portable plan is {len} bytes, more than the {max} a plan may take")]
    TooLarge { len: u64, max: u64 },
    #[error("portable plan is invalid: {0}")]
    Invalid(String),
    #[error("invalid reference {reference:?}: {why}")]
    BadReference { reference: String, why: String },
    #[error("registry {registry}: {what}")]
    Registry { registry: String, what: String },
    #[error("{what}: digest is {actual}, expected {expected}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("credentials in {path}: {why}")]
    Auth { path: PathBuf, why: String },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// `sha256:<hex>` of `bytes`, as OCI writes digests.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
