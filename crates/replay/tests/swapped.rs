//! Plan files swapped, after recording, for something that is not the
//! recorded regular file: a symlink to another file, or a FIFO. The real
//! backend must skip them without reading through the link or opening
//! the FIFO (which would block until a writer came), and say why. No root
//! needed. Each replay runs on a thread with a deadline so that a
//! regression fails instead of hanging.

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use warmstart_plan::trace::FileId;
use warmstart_plan::Plan;
use warmstart_replay::{file_id, replay, Options, RealBackend, Report, SkipReason};

const HANG_GUARD: Duration = Duration::from_secs(10);

fn identity(p: &Path) -> FileId {
    file_id(&warmstart_sys::open(p).unwrap().identity)
}

fn plan(files: &[(&Path, FileId)]) -> Plan {
    let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    let files: Vec<(&str, FileId)> = names
        .iter()
        .zip(files)
        .map(|(n, (_, id))| (n.as_str(), *id))
        .collect();
    let entries = (0..files.len() as u32)
        .map(|file| common::data(file, 0, 8192))
        .collect();
    common::plan(&files, &[], entries)
}

fn replay_bounded(p: Plan) -> Report {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let opts = Options {
            memory_floor: Some(0),
            ..Options::default()
        };
        let _ = tx.send(replay(&p, &opts, &RealBackend::new()).unwrap());
    });
    rx.recv_timeout(HANG_GUARD)
        .expect("the replay did not finish: it blocked on a swapped path")
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

#[test]
fn a_file_swapped_for_a_symlink_or_a_fifo_is_skipped_unread() {
    let d = tempfile::tempdir().unwrap();
    let kept = d.path().join("kept");
    let linked = d.path().join("linked");
    let fifo = d.path().join("fifo");
    let other = d.path().join("other");
    for p in [&kept, &linked, &fifo, &other] {
        std::fs::write(p, vec![1u8; 8192]).unwrap();
    }
    let recorded = plan(&[
        (&kept, identity(&kept)),
        (&linked, identity(&linked)),
        (&fifo, identity(&fifo)),
    ]);
    // The swaps: `linked` now points at another file of the same size,
    // `fifo` is a FIFO nobody writes to.
    std::fs::remove_file(&linked).unwrap();
    symlink(&other, &linked).unwrap();
    std::fs::remove_file(&fifo).unwrap();
    mkfifo(&fifo);

    let r = replay_bounded(recorded);
    let mut skipped: Vec<(String, String)> = r
        .skipped_files
        .iter()
        .map(|s| (s.path.clone(), s.reason.to_string()))
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        vec![
            (
                fifo.display().to_string(),
                "not a regular file (FIFO)".to_string()
            ),
            (
                linked.display().to_string(),
                "not a regular file (symlink)".to_string()
            ),
        ],
        "{r:#?}"
    );
    for s in &r.skipped_files {
        assert!(matches!(s.reason, SkipReason::NotRegular { .. }), "{s:?}");
    }
    // Only the file still as recorded was read: one page range of 8 KiB.
    assert_eq!(r.bytes_issued(), 8192, "{r:#?}");
}
