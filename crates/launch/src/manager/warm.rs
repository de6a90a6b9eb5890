//! The warm check: whether a plan is already in the page cache, so that
//! a launch gains nothing from replaying it.

use std::collections::HashMap;

use serde::Serialize;
use warmstart_plan::Plan;

use crate::store::{self, Store};

/// The windows the warm check samples: 16 of up to 64 KiB, evenly spaced
/// over the plan's data bytes, as (path, offset, length).
pub(super) fn warm_windows(plan: &Plan) -> Vec<(String, u64, u64)> {
    const SAMPLES: u64 = 16;
    const WINDOW: u64 = 64 * 1024;
    let data: Vec<(u32, u64, u64)> = plan
        .entries
        .iter()
        .filter_map(|e| match *e {
            warmstart_plan::Entry::Data { file, offset, len } => Some((file, offset, len)),
            _ => None,
        })
        .collect();
    let total: u64 = data.iter().map(|d| d.2).sum();
    if total == 0 {
        return Vec::new();
    }
    // Samples evenly spaced over the plan's bytes, not its entries: the C
    // library and the loader stay resident through a cache drop (every
    // process maps them) and are many small entries, so sampling entries
    // once called a cold launch of the fixture warm and skipped its replay.
    let (mut i, mut before) = (0usize, 0u64);
    (0..SAMPLES)
        .map(|k| {
            let at = total * (2 * k + 1) / (2 * SAMPLES);
            while before + data[i].2 <= at {
                before += data[i].2;
                i += 1;
            }
            let (file, offset, len) = data[i];
            let start = offset + (at - before);
            let path = plan.files[file as usize].path.clone();
            (path, start, WINDOW.min(offset + len - start))
        })
        .collect()
}

/// Whether at least 90% of the windows' pages are in the page cache. Costs
/// an open per distinct file and a cachestat per window: tens of
/// microseconds when warm. It stops as soon as 90% is out of reach: on a
/// cold cache each open walks directories read from disk, and the cold
/// launch's replay waits for this check.
pub(super) fn windows_cached(windows: &[(String, u64, u64)]) -> bool {
    // Samples often land in the same large file: open each file once.
    let mut open: HashMap<&str, std::fs::File> = HashMap::new();
    let (mut resident, mut pages) = (0u64, 0u64);
    // At least as many pages as the check will count (a window's pages,
    // cut at the end of its file), so stopping early never changes the answer.
    let all: u64 = windows
        .iter()
        .map(|(_, start, len)| start.saturating_add(*len).div_ceil(4096) - start / 4096)
        .sum();
    for (path, start, len) in windows {
        if (pages - resident) * 10 > all {
            return false;
        }
        let f = match open.entry(path.as_str()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                // A plan's path: a regular file only, never a FIFO or device.
                let Ok(o) = warmstart_sys::open(path) else {
                    return false;
                };
                e.insert(o.file)
            }
        };
        // cachestat counts pages still being read too: enough to tell a
        // warm cache from a cold one, and no mapping per window.
        let Ok(r) = warmstart_sys::residency::cached_or_resident(f, *start, *len) else {
            return false;
        };
        resident += r.resident;
        pages += r.pages;
    }
    // Not all: range merge reads holes a warm launch never touches.
    pages > 0 && resident * 10 >= pages * 9
}

/// Whether `plan` is already in the page cache, for a launch whose
/// program is already loaded (the daemon's, decided at the exec): the
/// warm check's windows, but only if every file they sample is in the
/// dentry cache, so that on a cold cache the answer costs no read from
/// storage and the replay starts at once. For clang's plan (90 files)
/// 0.08-0.15 ms when warm, under 0.05 ms cold; its replay, resident,
/// costs 15 ms of CPU.
pub(crate) fn plan_cached(plan: &Plan) -> bool {
    let windows = warm_windows(plan);
    let mut seen = std::collections::HashSet::new();
    for (path, _, _) in &windows {
        if seen.insert(path.as_str()) && !super::in_dcache(path.as_ref()) {
            return false;
        }
    }
    windows_cached(&windows)
}

/// Whether a launch of `program` (the binary, or the script an
/// interpreter will read) is cold: its path is not in the dentry cache,
/// or its first page is not in the page cache. Every launch reads that
/// page, so absent means a cold launch, known without the warm check's
/// opens: on a cold cache each of those walks directories read from
/// storage before the replay starts (the wrapper spent 36-63 ms before it
/// on the `cloud` model, 1.2 ms per read). A path the cache cannot
/// resolve is answered without a read: for a launch named by its hint,
/// whose program is not yet walked to, walking there is most of that
/// cost. (On a file system whose names are revalidated (NFS, FUSE) the
/// cache never answers, so such a launch is always taken as cold.)
pub(super) fn program_cold(program: &std::path::Path) -> bool {
    match warmstart_sys::cached::stat_cached(program) {
        warmstart_sys::cached::Cached::Unknown => true,
        _ => !program_cached(program),
    }
}

/// Whether the program's first page is in the page cache. Its path is
/// cached, so opening it reads nothing. A program that cannot be opened
/// says nothing (`true`: the full check decides).
pub(super) fn program_cached(program: &std::path::Path) -> bool {
    // /usr/bin/python3 and /usr/bin/clang are symlinks; plan paths never
    // are, so the real file is opened.
    let Ok(real) = std::fs::canonicalize(program) else {
        return true;
    };
    let Ok(o) = warmstart_sys::open(&real) else {
        return true;
    };
    match warmstart_sys::residency::cached_or_resident(&o.file, 0, 4096) {
        Ok(r) => r.pages == 0 || r.resident > 0,
        Err(_) => true,
    }
}

/// The warm check a plan was compiled with (`warm-check.json`), so that a
/// warm launch need not decode its plan: 0.76 ms for LibreOffice's (368
/// files, 1,949 entries) of a 2 ms budget.
#[derive(Debug, Serialize, serde::Deserialize)]
struct WarmCheck {
    windows: Vec<(String, u64, u64)>,
}

pub(super) fn save_warm_check(store: &Store, name: &str, plan: &Plan) {
    let check = WarmCheck {
        windows: warm_windows(plan),
    };
    let bytes = serde_json::to_vec(&check).expect("serializes");
    // Without it a launch decodes the plan instead.
    let _ = store::write_atomic(&store.warm_check_path(name), &bytes);
}

/// Whether the plan's sampled windows are resident: from `warm-check.json`
/// when it reads, else `None`.
pub(super) fn quick_warm(store: &Store, name: &str) -> Option<bool> {
    let bytes = std::fs::read(store.warm_check_path(name)).ok()?;
    let check: WarmCheck = serde_json::from_slice(&bytes).ok()?;
    Some(windows_cached(&check.windows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_check_counts_cached_regular_files_only() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, vec![1u8; 64 * 1024]).unwrap();
        let path = f.display().to_string();
        // Just written: cached.
        assert!(windows_cached(&[(path.clone(), 0, 64 * 1024)]));
        // A plan path swapped for a FIFO: not warm, and not opened.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let fifo = fifo.display().to_string();
        assert!(!windows_cached(&[(path, 0, 4096), (fifo, 0, 4096)]));
        assert!(!windows_cached(&[]));
    }

    #[test]
    fn a_program_whose_first_page_is_evicted_is_cold() {
        // O_DIRECT-free eviction needs a real filesystem: /var/tmp.
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let f = d.path().join("prog");
        std::fs::write(&f, vec![1u8; 64 * 1024]).unwrap();
        // Just written: cached.
        assert!(program_cached(&f));
        let file = std::fs::File::open(&f).unwrap();
        file.sync_all().unwrap();
        warmstart_sys::fadvise::dontneed(&file, 0, 0).unwrap();
        assert!(!program_cached(&f), "evicted, so cold");
        // Through a symlink, as /usr/bin/python3 is.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(!program_cached(&link));
        // Nothing to open: the full check decides.
        assert!(program_cached(&d.path().join("none")));
    }

    #[test]
    fn a_plan_is_cached_while_its_sampled_pages_are() {
        let d = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
        let f = d.path().join("lib");
        std::fs::write(&f, vec![1u8; 1 << 20]).unwrap();
        let plan = |path: &std::path::Path| {
            super::super::plan_reading(path.to_str().unwrap(), &[(0, 1 << 20)])
        };
        let empty = Plan {
            files: vec![],
            entries: vec![],
            ..plan(&f)
        };
        // Just written: cached.
        assert!(plan_cached(&plan(&f)));
        let file = std::fs::File::open(&f).unwrap();
        file.sync_all().unwrap();
        warmstart_sys::fadvise::dontneed(&file, 0, 0).unwrap();
        assert!(!plan_cached(&plan(&f)), "evicted");
        assert!(!plan_cached(&plan(&d.path().join("none"))), "missing");
        assert!(!plan_cached(&empty), "nothing to sample");
    }
}
