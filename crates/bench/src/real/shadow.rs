//! The `contention` scenario's plan: warmstart's plan made over private
//! copies of its files.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use warmstart_plan::Plan;

/// warmstart's plan made over copies of its files: replaying it costs
/// what replaying the real plan does, without warming the application.
pub(super) struct Shadow {
    /// Private to this run, removed with the shadow.
    pub(super) dir: tempfile::TempDir,
    pub(super) plan: Arc<Plan>,
    pub(super) files: Vec<String>,
}

/// Where `path` lives under `root`.
fn under(root: &Path, path: &str) -> std::path::PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Copies the files of `plan` into a new directory in `parent` and returns
/// the plan made over the copies: same entries, same order, same sizes.
/// Lookups go to the same names there, where the directories hold only
/// the copies (so they cost a little less than the real ones).
pub(super) fn make_shadow(plan: &Plan, parent: &Path) -> Result<Shadow> {
    use std::os::unix::fs::PermissionsExt;
    // Only the bench's user may read the copies: some come from
    // directories others cannot read.
    let dir = tempfile::Builder::new()
        .prefix("warmstart-bench-shadow-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .with_context(|| format!("creating a directory in {}", parent.display()))?;
    let root = dir.path();
    let mut files = Vec::new();
    let mut p = plan.clone();
    for f in &mut p.files {
        let to = under(root, &f.path);
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        // A file that cannot be copied (gone, unreadable) is left out as
        // the real replay leaves it out: its copy's path does not exist.
        if std::fs::copy(&f.path, &to).is_ok() {
            // No set-user-ID or set-group-ID copies.
            let m = std::fs::metadata(&to)?;
            let mode = m.permissions().mode() & 0o777 & !0o022;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
            let m = std::fs::metadata(&to)?;
            f.id = warmstart_record::resolve::file_id(&m);
            files.push(to.display().to_string());
        }
        f.path = to.display().to_string();
    }
    for l in &mut p.lookups {
        if l.path.starts_with('/') {
            let to = under(root, &l.path);
            if l.kind == warmstart_plan::trace::NsOpKind::DirRead {
                let _ = std::fs::create_dir_all(&to);
            }
            l.path = to.display().to_string();
        }
    }
    // The copies are written out before they are evicted and replayed.
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    Ok(Shadow {
        dir,
        plan: Arc::new(p),
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_plan::plan::{Lookup, PlanFile, PlanMeta};
    use warmstart_plan::trace::NsOpKind;
    use warmstart_plan::Entry;
    use warmstart_replay::{Options as ReplayOptions, RealBackend};

    #[test]
    fn shadow_plan_reads_copies_in_the_same_order() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("app");
        std::fs::create_dir_all(src.join("lib")).unwrap();
        let (a, b) = (src.join("bin"), src.join("lib/libx.so"));
        std::fs::write(&a, vec![1u8; 10_000]).unwrap();
        std::fs::write(&b, vec![2u8; 3_000]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let file = |p: &Path| PlanFile {
            path: p.display().to_string(),
            id: warmstart_record::resolve::file_id(&std::fs::metadata(p).unwrap()),
        };
        let lookup = |kind, p: &Path| Lookup {
            kind,
            path: p.display().to_string(),
        };
        let plan = Plan {
            meta: PlanMeta {
                command: vec!["bin".into()],
                created_unix_ms: 0,
                traces: 2,
                min_traces: 2,
                passes: Vec::new(),
                sorted: false,
            },
            // The last one is gone by the time the copies are made.
            files: vec![file(&a), file(&b), {
                let gone = src.join("gone");
                std::fs::write(&gone, b"x").unwrap();
                let f = file(&gone);
                std::fs::remove_file(&gone).unwrap();
                f
            }],
            lookups: vec![
                lookup(NsOpKind::DirRead, &src.join("lib")),
                lookup(NsOpKind::Stat, &src.join("missing")),
            ],
            entries: vec![
                Entry::Lookup { index: 0 },
                Entry::Data {
                    file: 1,
                    offset: 0,
                    len: 4096,
                },
                Entry::Lookup { index: 1 },
                Entry::Data {
                    file: 0,
                    offset: 0,
                    len: 8192,
                },
                Entry::Data {
                    file: 2,
                    offset: 0,
                    len: 4096,
                },
            ],
        };
        let sh = make_shadow(&plan, d.path()).unwrap();
        let root = sh.dir.path().to_path_buf();
        assert!(root.starts_with(d.path()));
        // Private, and no set-user-ID copy.
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
        assert_eq!(mode(&root) & 0o777, 0o700);
        let p = &sh.plan;
        assert_eq!(mode(Path::new(&p.files[1].path)) & 0o7777, 0o755);
        assert_eq!(p.entries, plan.entries);
        for (orig, copy) in plan.files.iter().zip(&p.files).take(2) {
            assert_eq!(copy.path, under(&root, &orig.path).display().to_string());
            assert_eq!(
                std::fs::read(&copy.path).unwrap(),
                std::fs::read(&orig.path).unwrap()
            );
            // The copy's own identity, so the replay opens it.
            let m = std::fs::metadata(&copy.path).unwrap();
            assert_eq!(copy.id, warmstart_record::resolve::file_id(&m));
            assert_ne!(copy.id.ino, orig.id.ino);
        }
        assert_eq!(sh.files.len(), 2);
        assert!(p
            .lookups
            .iter()
            .all(|l| l.path.starts_with(&*root.to_string_lossy())));
        assert!(Path::new(&p.lookups[0].path).is_dir());
        assert!(!Path::new(&p.lookups[1].path).exists());
        // A replay of the copies reads them, and skips the file that could
        // not be copied, as the real replay skips it.
        assert!(!Path::new(&p.files[2].path).exists());
        let r =
            warmstart_replay::replay(p, &ReplayOptions::default(), &RealBackend::new()).unwrap();
        assert_eq!(r.skipped_files.len(), 1);
        assert_eq!(r.files_opened, 2);
        // The copies go with the shadow; the originals stay.
        drop(sh);
        assert!(!root.exists());
        assert!(a.exists() && b.exists());
    }
}
