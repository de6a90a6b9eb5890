use super::*;
use warmstart_plan::trace::NsOpKind;

/// A plan over `files` (path, bytes) written under `dir`, reading the
/// first 4 KiB of each, with a metadata entry and lookups inside and
/// outside the files' directory.
fn setup(dir: &Path, files: &[(&str, Vec<u8>)]) -> Plan {
    let mut pf = Vec::new();
    let mut entries = Vec::new();
    for (i, (name, bytes)) in files.iter().enumerate() {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        pf.push(PlanFile {
            path: p.display().to_string(),
            id: identity::open_local(&p).unwrap().id,
        });
        entries.push(Entry::Data {
            file: i as u32,
            offset: 0,
            len: 4096,
        });
    }
    entries.push(Entry::Meta {
        device: 1,
        offset: 0,
        len: 4096,
    });
    entries.push(Entry::Lookup { index: 0 });
    entries.push(Entry::Lookup { index: 1 });
    Plan {
        meta: PlanMeta {
            command: vec!["/bin/app".into()],
            created_unix_ms: 1,
            traces: 2,
            min_traces: 2,
            passes: vec![],
            sorted: false,
        },
        files: pf,
        lookups: vec![
            Lookup {
                kind: NsOpKind::Stat,
                path: dir.join("absent.so").display().to_string(),
            },
            Lookup {
                kind: NsOpKind::Stat,
                path: "/elsewhere/secret".into(),
            },
        ],
        entries,
    }
}

#[test]
fn export_import_survives_new_inodes_and_drops_a_changed_file_by_name() {
    let d = tempfile::tempdir().unwrap();
    let files = [
        ("a", vec![1u8; 10_000]),
        ("b", vec![2u8; 10_000]),
        ("c", vec![3u8; 10_000]),
    ];
    let plan = setup(d.path(), &files);
    let (pp, notes) = export("app-1", &plan).unwrap();
    assert_eq!(notes.meta_entries, 1);
    assert!(notes.files.is_empty());
    let bytes = pp.to_bytes();
    let back = PortablePlan::from_bytes(&bytes).unwrap();
    assert_eq!(back, pp);

    // The files copied anew: new inodes, same bytes; then b changed
    // inside the range the plan reads, c changed outside it.
    let mut old_inodes = Vec::new();
    for (name, b) in &files {
        let p = d.path().join(name);
        old_inodes.push(identity::open_local(&p).unwrap().id.ino);
        // Kept aside, so that its inode cannot be reused for the copy.
        std::fs::rename(&p, p.with_extension("old")).unwrap();
        let mut b = b.clone();
        match *name {
            "b" => b[10] = 9,
            "c" => b[9_000] = 9,
            _ => {}
        }
        std::fs::write(&p, b).unwrap();
    }
    let imp = import(&back, Path::new("/")).unwrap();
    let b = d.path().join("b").display().to_string();
    assert_eq!(imp.dropped.len(), 1, "{:?}", imp.dropped);
    assert_eq!(imp.dropped[0].path, b);
    assert_eq!(imp.dropped[0].why, Why::Content { build_ids: None });
    assert_eq!(imp.plan.files.len(), 2);
    for f in &imp.plan.files {
        let here = identity::open_local(Path::new(&f.path)).unwrap().id;
        assert_eq!(f.id, here, "bound to the local inode");
    }
    assert!(imp
        .plan
        .files
        .iter()
        .all(|f| !old_inodes.contains(&f.id.ino)));
    assert_eq!((imp.kept_bytes, imp.total_bytes), (8192, 12288));
    // No metadata; the lookup inside the files' directory is kept, the
    // one elsewhere is not.
    assert!(imp
        .plan
        .entries
        .iter()
        .all(|e| !matches!(e, Entry::Meta { .. })));
    assert_eq!(imp.plan.lookups.len(), 1);
    assert_eq!(imp.lookups_dropped, 1);
    assert!(imp.plan.lookups[0].path.ends_with("absent.so"));
    assert_eq!(imp.plan.entries.len(), 3);
    imp.plan.check().unwrap();
}

#[test]
fn missing_and_resized_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let plan = setup(d.path(), &[("a", vec![1u8; 8000]), ("b", vec![1u8; 8000])]);
    let (pp, _) = export("app", &plan).unwrap();
    std::fs::remove_file(d.path().join("a")).unwrap();
    std::fs::write(d.path().join("b"), vec![1u8; 8001]).unwrap();
    let imp = import(&pp, Path::new("/")).unwrap();
    let whys: Vec<_> = imp.dropped.iter().map(|x| x.why.clone()).collect();
    assert_eq!(
        whys,
        [
            Why::Missing,
            Why::Size {
                expected: 8000,
                found: 8001
            }
        ]
    );
    assert!(imp.plan.files.is_empty());
    assert!(imp.dropped[1].to_string_hint().contains("/b"));
}

impl Dropped {
    fn to_string_hint(&self) -> String {
        format!("{}: {}", self.path, self.why)
    }
}

#[test]
fn a_file_changed_since_recording_is_not_exported() {
    let d = tempfile::tempdir().unwrap();
    let plan = setup(d.path(), &[("a", vec![1u8; 8000]), ("b", vec![1u8; 8000])]);
    std::fs::write(d.path().join("a"), vec![5u8; 8000]).unwrap();
    let (pp, notes) = export("app", &plan).unwrap();
    assert_eq!(pp.files.len(), 1);
    assert_eq!(notes.files[0].why, Why::ChangedSinceRecorded);
}

#[test]
fn hostile_or_foreign_inputs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let plan = setup(d.path(), &[("a", vec![1u8; 8000])]);
    let (good, _) = export("app", &plan).unwrap();
    let gz = |json: &[u8]| {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(json).unwrap();
        z.finish().unwrap()
    };
    let with = |f: &dyn Fn(&mut PortablePlan)| {
        let mut p = good.clone();
        f(&mut p);
        gz(&serde_json::to_vec(&p).unwrap())
    };
    // A gzip bomb: 300 MiB of zeros in well under a megabyte.
    let bomb = {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..300 {
            z.write_all(&zeros).unwrap();
        }
        z.finish().unwrap()
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("not gzip", b"{}".to_vec()),
        ("truncated", good.to_bytes()[..20].to_vec()),
        ("other JSON", gz(b"{\"format\":\"x\",\"version\":1}")),
        (
            "newer version",
            gz(b"{\"format\":\"warmstart-portable-plan\",\"version\":2}"),
        ),
        ("bomb", bomb),
        ("relative path", with(&|p| p.files[0].path = "etc/x".into())),
        (
            "dot-dot",
            with(&|p| p.files[0].path = "/a/../etc/shadow".into()),
        ),
        ("bad digest", with(&|p| p.files[0].sha256 = "zz".into())),
        ("bad name", with(&|p| p.profile = "../x".into())),
        (
            "range past the file",
            with(&|p| {
                p.entries[0] = Entry::Data {
                    file: 0,
                    offset: 0,
                    len: 1 << 40,
                }
            }),
        ),
        (
            "file index out of range",
            with(&|p| {
                p.entries[0] = Entry::Data {
                    file: 7,
                    offset: 0,
                    len: 4096,
                }
            }),
        ),
        (
            "metadata",
            with(&|p| {
                p.entries.push(Entry::Meta {
                    device: 1,
                    offset: 0,
                    len: 1,
                })
            }),
        ),
        (
            "listed twice",
            with(&|p| {
                let f = p.files[0].clone();
                p.files.push(f)
            }),
        ),
    ];
    for (name, bytes) in cases {
        assert!(PortablePlan::from_bytes(&bytes).is_err(), "{name} accepted");
    }
    assert!(PortablePlan::from_bytes(&good.to_bytes()).is_ok());
}

#[test]
fn an_odd_lookup_is_cleaned_or_left_out_never_the_plan() {
    let d = tempfile::tempdir().unwrap();
    let mut plan = setup(d.path(), &[("a", vec![1u8; 10_000])]);
    let n = plan.lookups.len() as u32;
    // fontconfig's double slash, as recorded before paths were cleaned,
    // and a path through `..`.
    let doubled = format!("{}//fonts.cache", d.path().display());
    plan.lookups.push(Lookup {
        kind: NsOpKind::Stat,
        path: doubled,
    });
    plan.lookups.push(Lookup {
        kind: NsOpKind::Stat,
        path: "/usr/lib/../share/x".into(),
    });
    plan.entries.push(Entry::Lookup { index: n });
    plan.entries.push(Entry::Lookup { index: n + 1 });
    let (pp, notes) = export("app-1", &plan).unwrap();
    assert_eq!(notes.lookups, vec!["/usr/lib/../share/x".to_string()]);
    let cleaned = format!("{}/fonts.cache", d.path().display());
    assert!(
        pp.lookups.iter().any(|l| l.path == cleaned),
        "{:?}",
        pp.lookups
    );
    assert!(pp.lookups.iter().all(|l| !l.path.contains("..")));
    // Every lookup entry still points at a lookup.
    for e in &pp.entries {
        if let Entry::Lookup { index } = e {
            assert!((*index as usize) < pp.lookups.len());
        }
    }
    PortablePlan::from_bytes(&pp.to_bytes()).unwrap();
}
