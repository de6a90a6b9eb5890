//! Root attack tests: an unprivileged program swaps a path warmstart has
//! recorded for a FIFO, a symlink to a device, a block device node or a
//! directory, and warmstart, running as root, must neither hang, nor open
//! the swapped-in file, nor name it in what it writes.
//!
//! A hang is the failure these tests look for, so every command runs under
//! a deadline that kills it and fails the test.

mod util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use util::*;

/// Far above what these commands take (BPF load included), far below a
/// hang's forever.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion, or kills it after [`DEADLINE`] and fails.
fn bounded(cmd: &mut Command, what: &str) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => out.expect("waiting for the command"),
        Err(_) => {
            // SAFETY: kill has no memory-safety preconditions; the pid is
            // our unreaped child, so it cannot have been reused.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{what}: still running after {DEADLINE:?} (hung), killed");
        }
    }
}

fn tempdir() -> tempfile::TempDir {
    // A real disk (not tmpfs), so the recorder sees page reads.
    tempfile::Builder::new()
        .prefix("ws-attack")
        .tempdir_in("/var/tmp")
        .unwrap()
}

/// A copy of a dynamically linked program at `dir/prog`: executing it
/// makes the recorder look for its ELF interpreter later.
fn program(dir: &Path) -> PathBuf {
    let src = std::fs::canonicalize("/bin/true").unwrap();
    let prog = dir.join("prog");
    std::fs::copy(&src, &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    prog
}

/// Every path a trace or plan names.
fn named(file: &Path) -> Vec<String> {
    show_json(file)["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str().map(str::to_string))
        .collect()
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Records `sh -c "$prog; rm $prog; SWAP"`: the program runs, then its
/// path is replaced before the recorder names what it read.
fn record_then_swap(test: &str, swap: &str, forbidden: &[&str]) {
    if !require_root(test) {
        return;
    }
    let dir = tempdir();
    let prog = program(dir.path());
    let p = prog.display().to_string();
    let trace = dir.path().join("out.trace");
    // The program's path is the script's $0.
    let script = format!("\"$0\"; rm \"$0\"; {swap}");
    let out = bounded(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&trace)
            .args(["--", "sh", "-c", &script, &p]),
        test,
    );
    assert_success(&out, test);
    // The swap really happened.
    let now = std::fs::symlink_metadata(&prog).expect("the swapped path exists");
    assert!(!now.is_file(), "{test}: {p} was swapped");
    let names = named(&trace);
    assert!(
        names
            .iter()
            .any(|n| n.contains("ld-linux") || n.contains("libc")),
        "{test}: the recording named the launch's libraries: {names:?}"
    );
    for bad in [p.as_str()].iter().chain(forbidden) {
        assert!(
            !names.iter().any(|n| n == bad),
            "{test}: the trace names {bad}, which is no longer the file read: {names:?}"
        );
    }
}

#[test]
fn root_record_survives_a_program_swapped_for_a_fifo() {
    record_then_swap(
        "root_record_survives_a_program_swapped_for_a_fifo",
        "mkfifo \"$0\"",
        &[],
    );
}

#[test]
fn root_record_survives_a_program_swapped_for_a_symlink_to_a_fifo() {
    record_then_swap(
        "root_record_survives_a_program_swapped_for_a_symlink_to_a_fifo",
        "mkfifo \"$0.fifo\" && ln -s \"$0.fifo\" \"$0\"",
        &[],
    );
}

#[test]
fn root_record_survives_a_program_swapped_for_a_symlink_to_dev_zero() {
    record_then_swap(
        "root_record_survives_a_program_swapped_for_a_symlink_to_dev_zero",
        "ln -s /dev/zero \"$0\"",
        &["/dev/zero"],
    );
}

#[test]
fn root_record_survives_a_program_swapped_for_a_block_device() {
    // The node of the disk the program was on: opening it would read the
    // disk as root.
    let m = std::fs::metadata("/var/tmp").unwrap();
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    record_then_swap(
        "root_record_survives_a_program_swapped_for_a_block_device",
        &format!("mknod \"$0\" b {major} {minor}"),
        &[],
    );
}

#[test]
fn root_record_survives_a_program_swapped_for_a_directory() {
    record_then_swap(
        "root_record_survives_a_program_swapped_for_a_directory",
        "mkdir \"$0\"",
        &[],
    );
}

/// `record --cold --from` evicts the files a previous trace names: one
/// swapped for a FIFO since must not hang it.
#[test]
fn root_record_cold_from_a_trace_whose_file_became_a_fifo() {
    let test = "root_record_cold_from_a_trace_whose_file_became_a_fifo";
    if !require_root(test) {
        return;
    }
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::write(&data, vec![7u8; 64 * 1024]).unwrap();
    let first = dir.path().join("first.trace");
    let out = bounded(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&first)
            .arg("--")
            .arg("cat")
            .arg(&data),
        test,
    );
    assert_success(&out, test);
    let d = data.display().to_string();
    assert!(named(&first).contains(&d), "the first trace names {d}");
    std::fs::remove_file(&data).unwrap();
    let c = std::ffi::CString::new(d.as_str()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let again = dir.path().join("again.trace");
    let out = bounded(
        Command::new(warmstart())
            .args(["record", "--cold", "--from"])
            .arg(&first)
            .arg("-o")
            .arg(&again)
            .args(["--", "true"]),
        test,
    );
    assert_success(&out, test);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&data)
        .unwrap()
        .file_type()
        .is_fifo());
}

/// `stream` names a file from `/proc/PID/fd`. A reader in its own mount
/// namespace reads a file through a bind mount that the host does not
/// have: there, the same path is a FIFO. Opening that path as root would
/// block forever; `stream` must see that it is not the inode read and
/// leave it.
#[test]
fn root_stream_leaves_a_proc_path_that_names_another_file() {
    let test = "root_stream_leaves_a_proc_path_that_names_another_file";
    if !require_root(test) {
        return;
    }
    let dir = tempdir();
    let src = dir.path().join("src");
    let view = dir.path().join("view");
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&view).unwrap();
    let real = src.join("big");
    run_ok(Command::new(fixture()).arg("mkfile").arg(&real).arg("64"));
    warmstart_evict(&real);
    // On the host, the path the reader's /proc entry will show is a FIFO.
    let seen = view.join("big");
    let c = std::ffi::CString::new(seen.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let script = format!(
        "mount --bind {src} {view} && exec {fixture} scan {seen} 1024 40 forward random",
        src = src.display(),
        view = view.display(),
        fixture = fixture().display(),
        seen = seen.display(),
    );
    let out = bounded(
        Command::new(warmstart())
            .args(["stream", "--interval", "0.25", "--json", "--"])
            .args(["unshare", "-m", "--propagation", "private", "sh", "-c"])
            .arg(&script),
        test,
    );
    assert_success(&out, test);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let files = r["files"].as_array().expect("files");
    // The reader's stream was seen (so stream did look for its path) ...
    assert!(
        files.iter().any(|f| f["used"].as_u64().unwrap_or(0) > 0),
        "the reader's pages were seen: {r}"
    );
    // ... and nothing was prefetched through the host's path.
    for f in files {
        if f["path"].as_str() == seen.to_str() {
            assert_eq!(f["prefetched"], 0, "{f}");
        }
    }
    assert_eq!(r["prefetched"], 0, "{r}");
}

/// Drops a file's cached pages (it is ours, a regular file).
fn warmstart_evict(p: &Path) {
    let f = std::fs::File::open(p).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: fadvise on a descriptor we own; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// `run` measures the device under a plan's largest file the first time
/// it prefetches (the strategy probe), and checks whether the plan's
/// windows are cached: with that file swapped for a FIFO, neither may
/// hang the launch.
#[test]
fn root_run_with_a_plan_file_swapped_for_a_fifo() {
    let test = "root_run_with_a_plan_file_swapped_for_a_fifo";
    if !require_root(test) {
        return;
    }
    let dir = tempdir();
    let state = tempfile::tempdir().unwrap();
    let big = dir.path().join("big");
    // Larger than any library `cat` maps: the file the probe picks.
    std::fs::write(&big, vec![3u8; 16 << 20]).unwrap();
    let run = |cmd: &[&std::ffi::OsStr]| {
        bounded(
            Command::new(warmstart())
                .args(["run", "--nrawseq", "1", "--strategy", "auto", "--state-dir"])
                .arg(state.path())
                .args(["--profile", "attack", "--"])
                .args(cmd),
            test,
        )
    };
    // Learns and compiles a plan naming `big`.
    let out = run(&["cat".as_ref(), big.as_os_str()]);
    assert_success(&out, test);
    let plan = state.path().join("profiles/attack/plan");
    let b = big.display().to_string();
    assert!(named(&plan).contains(&b), "the plan names {b}");
    std::fs::remove_file(&big).unwrap();
    let c = std::ffi::CString::new(b.as_str()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // Prefetches with that plan (the command itself leaves the FIFO be).
    let out = run(&["true".as_ref()]);
    assert_success(&out, test);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&big)
        .unwrap()
        .file_type()
        .is_fifo());
}
