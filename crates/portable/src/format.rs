//! The portable plan file: one JSON document, gzip-compressed. JSON so that
//! a fleet operator can read what a plan will make machines read (`zcat
//! app.wsplan | jq`); gzip because most of it is paths with long common
//! prefixes. The same bytes are the OCI layer ([`crate::oci`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warmstart_plan::plan::{Lookup, PlanFile, PlanMeta};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, Plan};

use crate::identity;
use crate::Error;

/// What the `format` field says.
pub const FORMAT: &str = "warmstart-portable-plan";
/// Bumped on incompatible changes; readers refuse other versions.
pub const VERSION: u32 = 1;
/// The most a portable plan file (compressed) may be.
pub const MAX_FILE: u64 = 64 << 20;
/// The most it may inflate to: a hostile file cannot exhaust memory.
pub const MAX_INFLATED: u64 = 256 << 20;
/// Far above any real launch (thousands of files, ~10^5 entries).
pub const MAX_FILES: usize = 1 << 18;
pub const MAX_ENTRIES: usize = 1 << 22;

/// One file of a portable plan, identified by content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortableFile {
    pub path: String,
    pub size: u64,
    /// SHA-256 (hex) of the ranges the plan reads ([`identity::digest_ranges`]).
    pub sha256: String,
    /// GNU build-id (hex) of an ELF file, to tell a rebuilt binary from a
    /// corrupted one in messages; the digest alone decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

/// A plan with content identities instead of inodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortablePlan {
    pub format: String,
    pub version: u32,
    /// The profile it was exported from: the name `import` writes.
    pub profile: String,
    pub meta: PlanMeta,
    pub files: Vec<PortableFile>,
    pub lookups: Vec<Lookup>,
    /// Data and lookup entries only, in the plan's order; `Data.file`
    /// indexes `files`.
    pub entries: Vec<Entry>,
}

/// The ranges of each file index that `entries` reads.
fn ranges_by_file(entries: &[Entry]) -> HashMap<u32, Vec<(u64, u64)>> {
    let mut m: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for e in entries {
        if let Entry::Data { file, offset, len } = *e {
            m.entry(file).or_default().push((offset, len));
        }
    }
    m
}

/// What export left out, for the user.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ExportNotes {
    /// Metadata entries: block offsets of this machine's file systems.
    pub meta_entries: usize,
    /// Files that could not be read or changed since the plan was made.
    pub files: Vec<Dropped>,
    /// Lookups left out: paths a portable plan cannot name (not absolute,
    /// or with `..`, which another machine's links may resolve elsewhere).
    pub lookups: Vec<String>,
}

/// Makes `plan` (of profile `profile`) portable by reading the ranges it
/// reads from this machine's files. A file that changed since it was
/// recorded (its identity no longer the plan's) is left out: its bytes are
/// not the ones the plan was learned on.
pub fn export(profile: &str, plan: &Plan) -> Result<(PortablePlan, ExportNotes), Error> {
    let mut notes = ExportNotes::default();
    let ranges = ranges_by_file(&plan.entries);
    let mut files = Vec::new();
    // Old index -> new index, for the files kept.
    let mut remap: HashMap<u32, u32> = HashMap::new();
    for (i, f) in plan.files.iter().enumerate() {
        let Some(r) = ranges.get(&(i as u32)) else {
            continue;
        };
        let path = Path::new(&f.path);
        let mut local = match identity::open_local(path) {
            Ok(l) => l,
            Err(e) => {
                notes
                    .files
                    .push(Dropped::new(&f.path, Why::Unreadable(e.to_string())));
                continue;
            }
        };
        if !same_file(&local.id, &f.id) {
            notes
                .files
                .push(Dropped::new(&f.path, Why::ChangedSinceRecorded));
            continue;
        }
        let size = local.id.size;
        let sha256 = identity::digest_ranges(&mut local.file, path, &identity::normalize(r, size))?;
        let build_id = identity::build_id(&mut local.file);
        remap.insert(i as u32, files.len() as u32);
        files.push(PortableFile {
            path: f.path.clone(),
            size,
            sha256,
            build_id,
        });
    }
    // One odd lookup never costs the whole plan: it is left out, named.
    let mut lookups = Vec::with_capacity(plan.lookups.len());
    let mut lookup_remap = HashMap::new();
    for (i, l) in plan.lookups.iter().enumerate() {
        let mut l = l.clone();
        l.path = warmstart_plan::path::lexically_clean(&l.path);
        if clean_absolute(&l.path) {
            lookup_remap.insert(i as u32, lookups.len() as u32);
            lookups.push(l);
        } else {
            notes.lookups.push(l.path);
        }
    }
    let mut entries = Vec::with_capacity(plan.entries.len());
    for e in &plan.entries {
        match *e {
            Entry::Data { file, offset, len } => {
                if let Some(&file) = remap.get(&file) {
                    entries.push(Entry::Data { file, offset, len });
                }
            }
            Entry::Meta { .. } => notes.meta_entries += 1,
            Entry::Lookup { index } => {
                if let Some(&index) = lookup_remap.get(&index) {
                    entries.push(Entry::Lookup { index });
                }
            }
        }
    }
    let pp = PortablePlan {
        format: FORMAT.into(),
        version: VERSION,
        profile: profile.into(),
        meta: plan.meta.clone(),
        files,
        lookups,
        entries,
    };
    pp.check()?;
    Ok((pp, notes))
}

/// The identity fields that say a file is still the recorded one.
fn same_file(a: &FileId, b: &FileId) -> bool {
    (a.dev, a.ino, a.size, a.mtime_ns, a.ctime_ns) == (b.dev, b.ino, b.size, b.mtime_ns, b.ctime_ns)
}

impl PortablePlan {
    /// The file's bytes: gzip of the JSON document.
    pub fn to_bytes(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a portable plan serializes");
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&json)
            .expect("compressing to memory cannot fail");
        z.finish().expect("compressing to memory cannot fail")
    }

    /// Decodes and validates a portable plan from untrusted bytes (a file,
    /// a registry): size-capped before and after inflating, then
    /// [`PortablePlan::check`]ed.
    pub fn from_bytes(bytes: &[u8]) -> Result<PortablePlan, Error> {
        if bytes.len() as u64 > MAX_FILE {
            return Err(Error::TooLarge {
                len: bytes.len() as u64,
                max: MAX_FILE,
            });
        }
        if !bytes.starts_with(&[0x1f, 0x8b]) {
            return Err(Error::Format("not gzip-compressed".into()));
        }
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(MAX_INFLATED + 1)
            .read_to_end(&mut json)
            .map_err(|e| Error::Format(format!("does not decompress: {e}")))?;
        if json.len() as u64 > MAX_INFLATED {
            return Err(Error::TooLarge {
                len: json.len() as u64,
                max: MAX_INFLATED,
            });
        }
        // The header first, so that another kind of JSON or a newer
        // version is named as such rather than as a missing field.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            version: Option<u32>,
        }
        let head: Head =
            serde_json::from_slice(&json).map_err(|e| Error::Format(format!("not JSON: {e}")))?;
        if head.format.as_deref() != Some(FORMAT) {
            return Err(Error::Format(format!(
                "format is {:?}, not {FORMAT:?}",
                head.format
            )));
        }
        if head.version != Some(VERSION) {
            return Err(Error::Format(format!(
                "version {:?} is not supported (this warmstart reads {VERSION})",
                head.version
            )));
        }
        let pp: PortablePlan =
            serde_json::from_slice(&json).map_err(|e| Error::Invalid(e.to_string()))?;
        pp.check()?;
        Ok(pp)
    }

    /// Invariants, on top of [`Plan::check`]'s: bounded counts, absolute
    /// clean paths listed once, digests of the right shape, a valid
    /// profile name, and no metadata entries.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |s: String| Err(Error::Invalid(s));
        if self.files.len() > MAX_FILES || self.entries.len() > MAX_ENTRIES {
            return bad(format!(
                "{} files and {} entries, more than {MAX_FILES} and {MAX_ENTRIES}",
                self.files.len(),
                self.entries.len()
            ));
        }
        if self.lookups.len() > MAX_ENTRIES {
            return bad(format!("{} lookups", self.lookups.len()));
        }
        let name_ok = !self.profile.is_empty()
            && self.profile.len() <= 128
            && !self.profile.starts_with('.')
            && self
                .profile
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !name_ok {
            return bad(format!("profile name {:?}", self.profile));
        }
        let mut seen = HashSet::new();
        for f in &self.files {
            if !clean_absolute(&f.path) {
                return bad(format!("file path {:?} is not absolute and clean", f.path));
            }
            if !seen.insert(f.path.as_str()) {
                return bad(format!("{} is listed twice", f.path));
            }
            let hex = |s: &str, n: std::ops::RangeInclusive<usize>| {
                n.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
            };
            if !hex(&f.sha256, 64..=64) || f.build_id.as_deref().is_some_and(|b| !hex(b, 2..=128)) {
                return bad(format!("{}: malformed digest", f.path));
            }
        }
        for l in &self.lookups {
            if !clean_absolute(&l.path) {
                return bad(format!(
                    "lookup path {:?} is not absolute and clean",
                    l.path
                ));
            }
        }
        if self.entries.iter().any(|e| matches!(e, Entry::Meta { .. })) {
            return bad("metadata entries are machine-specific".into());
        }
        // The plan's own checks (indices, ranges within sizes), with
        // stand-in identities that are unique as the check requires.
        self.to_plan(|i| FileId {
            ino: i as u64 + 1,
            size: self.files[i].size,
            ..FileId::default()
        })
        .check()
        .map_err(|e| Error::Invalid(e.to_string()))
    }

    fn to_plan(&self, id: impl Fn(usize) -> FileId) -> Plan {
        Plan {
            meta: self.meta.clone(),
            files: self
                .files
                .iter()
                .enumerate()
                .map(|(i, f)| PlanFile {
                    path: f.path.clone(),
                    id: id(i),
                })
                .collect(),
            lookups: self.lookups.clone(),
            entries: self.entries.clone(),
        }
    }
}

/// An absolute path without `.`, `..`, empty components or NUL.
fn clean_absolute(p: &str) -> bool {
    p.len() < 4096 && !p.contains('\0') && warmstart_plan::path::is_clean_absolute(p)
}

/// Why a file's entries were dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    Missing,
    Unreadable(String),
    /// Of another size here.
    Size {
        expected: u64,
        found: u64,
    },
    /// The bytes the plan reads differ; with both build-ids when the files
    /// are ELF and the ids differ (another build, not a corrupt copy).
    Content {
        build_ids: Option<(String, String)>,
    },
    /// Another path of the plan is the same local file (a hard link).
    SameFileAs(String),
    /// At export: the file changed since the plan was recorded.
    ChangedSinceRecorded,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Missing => f.write_str("missing here"),
            Why::Unreadable(e) => write!(f, "unreadable: {e}"),
            Why::Size { expected, found } => {
                write!(
                    f,
                    "size differs ({found} bytes here, {expected} in the plan)"
                )
            }
            Why::Content { build_ids: None } => f.write_str("content differs"),
            Why::Content {
                build_ids: Some((a, b)),
            } => write!(f, "content differs (build-id {b} here, {a} in the plan)"),
            Why::SameFileAs(p) => write!(f, "same file as {p}"),
            Why::ChangedSinceRecorded => f.write_str("changed since the plan was recorded"),
        }
    }
}

/// One file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub path: String,
    pub why: Why,
}

impl Dropped {
    fn new(path: &str, why: Why) -> Dropped {
        Dropped {
            path: path.into(),
            why,
        }
    }
}

/// The result of checking a portable plan against this machine.
#[derive(Debug, Clone)]
pub struct Imported {
    /// Bound to the local files' identities; only files that passed.
    pub plan: Plan,
    pub dropped: Vec<Dropped>,
    /// Data bytes of the files kept, and of all files.
    pub kept_bytes: u64,
    pub total_bytes: u64,
    /// Lookups left out: outside every directory that holds a kept file.
    pub lookups_dropped: usize,
}

/// Checks every file of `pp` against the local one, under `root` ("/" for
/// the real system; a directory for tests and for checking an image):
/// same size and the same digest of the ranges the plan reads. Files that
/// differ are dropped with their entries; the rest are bound to the local
/// identities, so the replay's own per-file check passes here.
pub fn import(pp: &PortablePlan, root: &Path) -> Result<Imported, Error> {
    pp.check()?;
    let ranges = ranges_by_file(&pp.entries);
    let mut dropped = Vec::new();
    let mut files: Vec<PlanFile> = Vec::new();
    let mut remap: HashMap<u32, u32> = HashMap::new();
    let mut inodes: HashMap<(u64, u64), String> = HashMap::new();
    for (i, f) in pp.files.iter().enumerate() {
        let local_path: PathBuf = root.join(f.path.trim_start_matches('/'));
        let mut local = match identity::open_local(&local_path) {
            Ok(l) => l,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                dropped.push(Dropped::new(&f.path, Why::Missing));
                continue;
            }
            // The path is in the message already.
            Err(Error::Io { source, .. }) => {
                dropped.push(Dropped::new(&f.path, Why::Unreadable(source.to_string())));
                continue;
            }
            Err(_) => {
                dropped.push(Dropped::new(
                    &f.path,
                    Why::Unreadable("not a regular file".into()),
                ));
                continue;
            }
        };
        if local.id.size != f.size {
            dropped.push(Dropped::new(
                &f.path,
                Why::Size {
                    expected: f.size,
                    found: local.id.size,
                },
            ));
            continue;
        }
        let r = identity::normalize(ranges.get(&(i as u32)).map_or(&[][..], |v| v), f.size);
        let digest = identity::digest_ranges(&mut local.file, &local_path, &r)?;
        if digest != f.sha256 {
            let here = identity::build_id(&mut local.file);
            let build_ids = match (&f.build_id, here) {
                (Some(a), Some(b)) if *a != b => Some((a.clone(), b)),
                _ => None,
            };
            dropped.push(Dropped::new(&f.path, Why::Content { build_ids }));
            continue;
        }
        if let Some(other) = inodes.get(&(local.id.dev, local.id.ino)) {
            dropped.push(Dropped::new(&f.path, Why::SameFileAs(other.clone())));
            continue;
        }
        inodes.insert((local.id.dev, local.id.ino), f.path.clone());
        remap.insert(i as u32, files.len() as u32);
        files.push(PlanFile {
            path: f.path.clone(),
            id: local.id,
        });
    }
    // Lookups only inside directories this import trusts: those holding a
    // file that passed (and their ancestors).
    let mut dirs: BTreeSet<&str> = BTreeSet::new();
    for f in &files {
        let mut p = f.path.as_str();
        while let Some(i) = p.rfind('/') {
            p = if i == 0 { "/" } else { &p[..i] };
            if !dirs.insert(p) || p == "/" {
                break;
            }
        }
    }
    let kept_file: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let mut lookups = Vec::new();
    let mut lookup_remap: HashMap<u32, u32> = HashMap::new();
    for (i, l) in pp.lookups.iter().enumerate() {
        let parent = match l.path.rfind('/') {
            Some(0) => "/",
            Some(j) => &l.path[..j],
            None => continue,
        };
        let p = l.path.as_str();
        if kept_file.contains(p) || dirs.contains(p) || dirs.contains(parent) {
            lookup_remap.insert(i as u32, lookups.len() as u32);
            lookups.push(l.clone());
        }
    }
    let mut entries = Vec::with_capacity(pp.entries.len());
    let (mut kept_bytes, mut total_bytes) = (0u64, 0u64);
    for e in &pp.entries {
        match *e {
            Entry::Data { file, offset, len } => {
                total_bytes = total_bytes.saturating_add(len);
                if let Some(&file) = remap.get(&file) {
                    kept_bytes = kept_bytes.saturating_add(len);
                    entries.push(Entry::Data { file, offset, len });
                }
            }
            Entry::Lookup { index } => {
                if let Some(&index) = lookup_remap.get(&index) {
                    entries.push(Entry::Lookup { index });
                }
            }
            Entry::Meta { .. } => {}
        }
    }
    let mut meta = pp.meta.clone();
    meta.passes.push("imported".into());
    let plan = Plan {
        meta,
        files,
        lookups,
        entries,
    };
    plan.check()
        .map_err(|e| Error::Invalid(format!("imported plan: {e}")))?;
    Ok(Imported {
        plan,
        dropped,
        kept_bytes,
        total_bytes,
        lookups_dropped: pp.lookups.len() - lookup_remap.len(),
    })
}

/// Reads a portable plan file: a regular file, size-capped before reading.
pub fn read_file(path: &Path) -> Result<PortablePlan, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    // The user names this file: a symlink to it is fine, a FIFO is not.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = file.metadata().map_err(|e| Error::io(path, e))?;
    if !m.is_file() {
        return Err(Error::NotRegular {
            path: path.to_path_buf(),
        });
    }
    if m.len() > MAX_FILE {
        return Err(Error::TooLarge {
            len: m.len(),
            max: MAX_FILE,
        });
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    PortablePlan::from_bytes(&bytes)
}

#[cfg(test)]
mod tests;
