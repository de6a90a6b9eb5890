//! End-to-end tests of `warmstart record` on the real kernel (root).

mod util;

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Stdio};

use util::*;

/// Pages each file has in the trace, and the order files first appear.
fn trace_pages(trace: &serde_json::Value) -> (HashMap<String, BTreeSet<u64>>, Vec<String>) {
    let mut pages = HashMap::new();
    let mut order = Vec::new();
    for f in trace["files"].as_array().expect("files") {
        let Some(path) = f["path"].as_str() else {
            continue;
        };
        order.push(path.to_string());
        let set: &mut BTreeSet<u64> = pages.entry(path.to_string()).or_default();
        for r in f["ranges"].as_array().expect("ranges") {
            let (off, len) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            set.extend(off / 4096..(off + len).div_ceil(4096));
        }
    }
    (pages, order)
}

/// The file page where an ELF program's first bss begins: the kernel
/// zeroes its tail while exec'ing the program (`padzero`), a page fault
/// made before the exec event. None if no loadable segment has a bss.
fn bss_boundary_page(path: &std::path::Path) -> Option<u64> {
    let b = std::fs::read(path).unwrap();
    let u16at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
    let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    assert_eq!(&b[..5], b"\x7fELF\x02", "a 64-bit ELF");
    let (phoff, phentsize, phnum) = (u64at(0x20) as usize, u16at(0x36), u16at(0x38));
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        let ptype = u32::from_le_bytes(b[ph..ph + 4].try_into().unwrap());
        let (offset, filesz, memsz) = (u64at(ph + 8), u64at(ph + 0x20), u64at(ph + 0x28));
        (ptype == 1 && memsz > filesz && filesz > 0).then(|| (offset + filesz) / 4096)
    })
}

fn check_fixture_trace(
    fs: &LoopFs,
    trace_file: &std::path::Path,
    stdout: &[u8],
    noise: &str,
    label: &str,
) {
    let trace = show_json(trace_file);
    let touched = touches(stdout);
    assert!(
        touched.len() > 100,
        "{label}: the fixture reported its touches"
    );
    let (pages, order) = trace_pages(&trace);

    // Coverage: every page the fixture touched is in the trace.
    let mut missing = Vec::new();
    let mut total = 0;
    for (path, first, count) in &touched {
        for p in *first..first + count {
            total += 1;
            if !pages.get(path).is_some_and(|s| s.contains(&p)) {
                missing.push(format!("{path}:{p}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{label}: {} of {total} touched pages missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );

    // Order at file-first-touch granularity.
    let mut want: Vec<&str> = Vec::new();
    for (p, _, _) in &touched {
        if !want.contains(&p.as_str()) {
            want.push(p);
        }
    }
    let prefix = fs.mnt.join("data").display().to_string();
    let got: Vec<&str> = order
        .iter()
        .map(String::as_str)
        .filter(|p| p.starts_with(&prefix))
        .collect();
    assert_eq!(got, want, "{label}: files in first-touch order");

    // Nothing from processes outside the tree, no drops.
    assert!(
        !order.iter().any(|p| p.ends_with(noise)),
        "{label}: a file read only by an outside process is in the trace"
    );
    assert_eq!(trace["stats"]["drops"], 0, "{label}: events were dropped");
    assert_eq!(trace["meta"]["backend"], "bpf");
    assert_eq!(trace["meta"]["exit_code"], 0);
}

#[test]
fn root_record_fixture_cold_and_warm_on_ext4() {
    if !require_root("root_record_fixture_cold_and_warm_on_ext4") {
        return;
    }
    let fs = LoopFs::new("ext4", 96);
    run_ok(Command::new(fixture()).arg("gen").arg(&fs.mnt));
    let work = tempfile::tempdir().unwrap();
    // Cold: evict this filesystem's pages and metadata first.
    fs.evict();
    // Another process reads a file on the same filesystem all along
    // (started after the eviction, which unmounts).
    let noise = fs.mnt.join("noise.bin");
    std::fs::write(&noise, vec![7u8; 1 << 20]).unwrap();
    let _noisy = Background::spawn(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while :; do cat {} > /dev/null; sleep 0.01; done",
                noise.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let cold = work.path().join("cold.trace");
    let out = run_ok(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&cold)
            .arg("--")
            .arg(fixture())
            .arg("run")
            .arg(&fs.mnt),
    );
    check_fixture_trace(&fs, &cold, &out.stdout, "noise.bin", "cold");
    let t = show_json(&cold);
    assert!(
        t["stats"]["bytes_from_storage"].as_u64().unwrap() > 1 << 20,
        "a cold launch reads from storage"
    );
    assert!(
        t["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["device"].as_u64().is_some()),
        "cold launch reads fs metadata"
    );

    // Warm: everything cached; the page uses must still give the full picture.
    let warm = work.path().join("warm.trace");
    let out = run_ok(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&warm)
            .arg("--")
            .arg(fixture())
            .arg("run")
            .arg(&fs.mnt),
    );
    check_fixture_trace(&fs, &warm, &out.stdout, "noise.bin", "warm");

    // --cold --from evicts exactly the files a previous trace names.
    let again = work.path().join("again.trace");
    let out = run_ok(
        Command::new(warmstart())
            .args(["record", "--cold", "--from"])
            .arg(&warm)
            .arg("-o")
            .arg(&again)
            .arg("--")
            .arg(fixture())
            .arg("run")
            .arg(&fs.mnt),
    );
    check_fixture_trace(&fs, &again, &out.stdout, "noise.bin", "cold --from");
    let t = show_json(&again);
    assert_eq!(t["meta"]["cache"], "cold");
    assert!(
        t["stats"]["bytes_from_storage"].as_u64().unwrap() > 1 << 20,
        "--cold --from evicted the files"
    );
}

#[test]
fn root_record_real_python_resolves_paths() {
    if !require_root("root_record_real_python_resolves_paths") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("py.trace");
    run_ok(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&out)
            .args(["--", "python3", "-c", "import json, email, asyncio"]),
    );
    let t = show_json(&out);
    let pages = t["stats"]["pages"].as_u64().unwrap();
    let unresolved = t["stats"]["pages_unresolved"].as_u64().unwrap();
    assert!(pages > 100, "python reads more than 100 pages: {pages}");
    let resolved = pages as f64 / (pages + unresolved) as f64;
    assert!(
        resolved >= 0.99,
        "resolved {:.2}% of data pages ({unresolved} unnamed)",
        resolved * 100.0
    );
    assert!(t["files"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["path"].as_str().is_some_and(|p| p.contains("/json/"))));
    assert!(
        t["namespace_ops"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["result"].as_i64().unwrap() < 0),
        "negative lookups recorded"
    );

    // The misses of a PATH search are lookups too (execvp tries each
    // directory in turn); the exec that succeeds is recorded once.
    let search = work.path().join("search.trace");
    let missing = work.path().join("not-here");
    run_ok(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&search)
            .env("PATH", format!("{}:/usr/bin", missing.display()))
            .args(["--", "/usr/bin/env", "python3", "-c", "pass"]),
    );
    let t = show_json(&search);
    let execs: Vec<(String, i64)> = t["namespace_ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["op"] == "exec")
        .map(|o| {
            (
                o["path"].as_str().unwrap().to_string(),
                o["result"].as_i64().unwrap(),
            )
        })
        .collect();
    let miss = format!("{}/python3", missing.display());
    assert!(
        execs.iter().any(|(p, r)| *p == miss && *r < 0),
        "the PATH search's miss: {execs:?}"
    );
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    assert_eq!(
        execs
            .iter()
            .filter(|(p, _)| std::path::Path::new(p) == python || p == "/usr/bin/python3")
            .count(),
        1,
        "{execs:?}"
    );

    // A reader that stops reading ends `show` quietly, as SIGPIPE would.
    let mut show = Command::new(warmstart())
        .args(["show", "--format", "csv"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(show.stdout.take());
    let shown = show.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        shown.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}",
        shown.status
    );
    assert!(
        shown.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );

    // The page the kernel zeroes Python's bss from while exec'ing it is the
    // launch's, though touched before the exec event. (On a cold launch it
    // was the first wait: its fault read 4 MiB around it.)
    let exe = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let bss = bss_boundary_page(&exe).expect("python has a bss");
    let out = work.path().join("exec.trace");
    run_ok(
        Command::new(warmstart())
            .arg("record")
            .arg("-o")
            .arg(&out)
            .args(["--", "/usr/bin/python3", "-c", "pass"]),
    );
    let (pages, _) = trace_pages(&show_json(&out));
    assert!(
        pages
            .get(exe.to_str().unwrap())
            .is_some_and(|p| p.contains(&bss)),
        "page {bss} of {} (where its bss starts) is in the trace",
        exe.display()
    );
}

#[test]
fn root_record_is_transparent() {
    if !require_root("root_record_is_transparent") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let t = work.path().join("t.trace");
    let out = run(Command::new(warmstart())
        .arg("-q")
        .arg("record")
        .arg("-o")
        .arg(&t)
        .args(["--", "sh", "-c", "echo out; echo err >&2; exit 7"]));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let out = run(Command::new(warmstart())
        .arg("-q")
        .arg("record")
        .arg("-o")
        .arg(&t)
        .args(["--", "sh", "-c", "kill -TERM $$"]));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(15), "killed by the same signal");
    let out = run(Command::new(warmstart())
        .arg("record")
        .arg("-o")
        .arg(&t)
        .args(["--", "/nonexistent/prog"]));
    // What a shell reports for a command it cannot find.
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot start"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn root_record_tracefs_and_mincore_backends() {
    if !require_root("root_record_tracefs_and_mincore_backends") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    for backend in ["tracefs", "mincore"] {
        let t = work.path().join(format!("{backend}.trace"));
        run_ok(
            Command::new(warmstart())
                .args(["record", "--backend", backend, "-o"])
                .arg(&t)
                .args(["--", "python3", "-c", "import json, time; time.sleep(0.5)"]),
        );
        let j = show_json(&t);
        assert_eq!(j["meta"]["backend"], backend);
        assert_eq!(j["meta"]["ordered"], backend != "mincore");
        assert!(
            j["files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["path"].as_str().is_some_and(|p| p.contains("libc.so"))),
            "{backend}: the C library is in the trace"
        );
    }
}

/// btrfs reports a file's pages under its superblock's device, while
/// `stat` gives its subvolume's: the file is named all the same, with the
/// identity a replay will check.
#[test]
fn root_record_names_files_on_btrfs() {
    if !require_root("root_record_names_files_on_btrfs") {
        return;
    }
    let fs = LoopFs::new("btrfs", 512);
    let data = fs.mnt.join("data");
    std::fs::write(&data, vec![7u8; 3 << 20]).unwrap();
    fs.evict();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.trace");
    run_ok(
        Command::new(warmstart())
            .args(["record", "-o"])
            .arg(&out)
            .arg("--")
            .arg("cat")
            .arg(&data)
            .stdout(std::process::Stdio::null()),
    );
    let (pages, _) = trace_pages(&show_json(&out));
    let name = data.display().to_string();
    assert!(
        pages.get(&name).is_some_and(|p| p.len() >= 700),
        "{name} not named or not read: {:?}",
        pages.keys().collect::<Vec<_>>()
    );
}
