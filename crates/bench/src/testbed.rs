//! `--fs`: the bench run inside a storage testbed (see the
//! `warmstart-testbed` crate): a filesystem image on a direct-I/O loop
//! device, optionally on a slow-device model.
//!
//! The outer process prepares the testbed and then runs the whole harness
//! again *inside* it (`Testbed::command`: a private mount namespace and a
//! chroot over the image). Recording, the in-process replays, `warmstart
//! run` and the daemon then all see the same paths as the program they
//! measure, so traces and plans made inside stay valid inside; nothing is
//! translated. The harness binary and the warmstart binary are bind-mounted
//! in at their host paths, and so is the suite's directory.
//!
//! The inner harness makes launches cold by asking the outer process, over
//! a socket it inherits, to run [`Testbed::drop_caches`] (page cache, the
//! loop device's buffer cache and, without direct I/O, the backing file's
//! pages). Each launch's reads from the loop device are counted from
//! `/sys/block/loopN/stat` and kept with the run.
//!
//! Exports are written by the inner harness into a directory under the
//! image's `/var/tmp` and copied out by the outer one when it is done.
//! `bench usage --fs` runs the same way ([`run_inside`]).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use warmstart_testbed::{BlockStat, DeviceFigures, Fs, Profile, Testbed, TestbedSpec};

use crate::BenchArgs;

/// Environment of the inner harness: the testbed it runs in (JSON).
const ENV_INFO: &str = "WARMSTART_BENCH_TESTBED";
/// Environment of the inner harness: the descriptor of the cache socket.
const ENV_FD: &str = "WARMSTART_BENCH_TESTBED_FD";
/// Prefix of the inner harness's directories in the image's `/var/tmp`
/// (exports here; the contention copies and the run/daemon state beside).
const OUT_PREFIX: &str = "warmstart-bench-";

/// What the results say about the testbed they were measured in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestbedInfo {
    /// ext4, xfs or btrfs.
    pub fs: String,
    /// The storage profile, or none (the host's disk under the loop).
    pub storage: Option<String>,
    /// The image file on the host.
    pub image: String,
    /// The loop device the filesystem is on.
    pub loop_device: String,
    /// Whether the loop does direct I/O to its backing file.
    pub direct_io: bool,
    /// One line: filesystem, device model.
    pub description: String,
    /// What was copied into the image.
    pub contents: Vec<String>,
    /// Where the image's filesystem is mounted on the host (the chroot).
    pub host_root: String,
    /// fio figures of the device under the testbed (with a profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceFigures>,
}

impl TestbedInfo {
    /// Lines for the text report.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "testbed: {} ({}, image {})",
            self.description, self.loop_device, self.image
        )];
        if let Some(d) = &self.device {
            out.push(format!(
                "device (fio on {}): {d}",
                self.storage.as_deref().unwrap_or("the loop device")
            ));
        }
        out
    }
}

/// The testbed this (inner) harness runs in, if any.
pub fn inner() -> Option<&'static Inner> {
    static INNER: OnceLock<Option<Inner>> = OnceLock::new();
    INNER.get_or_init(Inner::from_env).as_ref()
}

/// Syncs and drops the page cache: the testbed's, through its owner, when
/// this harness runs inside one (the loop device's own cache included),
/// else the whole machine's.
pub fn drop_caches() -> Result<()> {
    match inner() {
        Some(tb) => tb.drop_caches(),
        None => warmstart_record::evict::drop_all_caches()
            .context("dropping caches (needs root; the main bench can --evict-files instead)"),
    }
}

/// The inner harness's side: what testbed it is in and the way to make
/// launches cold.
pub struct Inner {
    pub info: TestbedInfo,
    ctl: Mutex<BufReader<UnixStream>>,
}

impl Inner {
    fn from_env() -> Option<Inner> {
        let info: TestbedInfo = serde_json::from_str(&std::env::var(ENV_INFO).ok()?).ok()?;
        let fd: i32 = std::env::var(ENV_FD).ok()?.parse().ok()?;
        // The launched programs must not hold the socket.
        // SAFETY: fcntl on a descriptor number; a bad one only fails.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: the outer harness passed this descriptor, open, for us
        // alone; nothing else in this process owns it.
        let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Some(Inner {
            info,
            ctl: Mutex::new(BufReader::new(sock)),
        })
    }

    /// Asks the outer harness to drop the testbed's caches
    /// ([`Testbed::drop_caches`]) and waits until it has.
    pub fn drop_caches(&self) -> Result<()> {
        let mut c = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
        c.get_mut()
            .write_all(b"drop\n")
            .context("asking the testbed to drop caches")?;
        let mut line = String::new();
        c.read_line(&mut line)
            .context("waiting for the testbed to drop caches")?;
        match line.trim_end() {
            "ok" => Ok(()),
            "" => bail!("the testbed's owner is gone"),
            e => bail!("dropping the testbed's caches: {e}"),
        }
    }

    /// Bytes read from the loop device so far.
    pub fn device_read_bytes(&self) -> Option<u64> {
        let name = Path::new(&self.info.loop_device).file_name()?;
        let text = std::fs::read_to_string(Path::new("/sys/block").join(name).join("stat")).ok()?;
        BlockStat::parse(&text).map(|s| s.read_sectors * 512)
    }
}

/// `--testbed-cleanup`: removes images and what killed runs left.
pub fn cleanup(cache_dir: &Path, quiet: bool) -> Result<i32> {
    let r = warmstart_testbed::cleanup(cache_dir)
        .with_context(|| format!("cleaning up testbeds in {}", cache_dir.display()))?;
    if !quiet {
        if r.is_empty() {
            eprintln!("warmstart: no testbed leftovers in {}", cache_dir.display());
        }
        for p in &r.unmounted {
            eprintln!("warmstart: unmounted {}", p.display());
        }
        for p in &r.detached {
            eprintln!("warmstart: detached {}", p.display());
        }
        for p in &r.removed {
            eprintln!("warmstart: removed {}", p.display());
        }
    }
    Ok(0)
}

/// Runs the bench inside a testbed of `fs`; returns the inner harness's
/// exit code.
pub fn run(args: &BenchArgs, fs: Fs, quiet: bool) -> Result<i32> {
    let suite = match &args.suite {
        Some(s) => Some(
            s.canonicalize()
                .with_context(|| format!("resolving {}", s.display()))?,
        ),
        None => None,
    };
    let outer = Outer {
        fs,
        storage: args.storage,
        cache_dir: args.testbed_cache.clone(),
        contents: args.testbed_content.clone(),
        binds: suite
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .into_iter()
            .collect(),
    };
    run_inside(
        outer,
        quiet,
        |_, out| Ok(inner_args(args, suite.as_deref(), out, quiet)),
        |out| copy_out(args, out),
    )
}

/// A harness to be run again inside a testbed.
pub struct Outer {
    pub fs: Fs,
    pub storage: Option<Profile>,
    /// `--testbed-cache`.
    pub cache_dir: Option<PathBuf>,
    /// `--testbed-content` (empty: the system's trees).
    pub contents: Vec<PathBuf>,
    /// Host directories the inner harness reads or writes at their own
    /// paths (the suite's directory), bind-mounted in.
    pub binds: Vec<PathBuf>,
}

/// Prepares the testbed of `o` and runs this binary again inside it, with
/// the arguments `args` gives (from the output directory on the host, to
/// put inputs in, and the same directory as the inner harness sees it);
/// `copy_out` then takes what the inner harness left in that directory (on
/// the host). Returns the inner harness's exit code.
pub fn run_inside(
    o: Outer,
    quiet: bool,
    args: impl FnOnce(&Path, &Path) -> Result<Vec<std::ffi::OsString>>,
    copy_out: impl FnOnce(&Path) -> Result<()>,
) -> Result<i32> {
    let fs = o.fs;
    let mut spec = TestbedSpec::new(fs);
    spec.storage = o.storage;
    if let Some(d) = &o.cache_dir {
        spec.cache_dir = d.clone();
    }
    if !o.contents.is_empty() {
        spec.contents = o.contents.clone();
    }
    let exe = std::env::current_exe().context("finding the harness binary")?;
    spec.binds.push(exe.clone());
    let warmstart = crate::wrapped::warmstart_binary().filter(|b| b.is_file());
    if let Some(b) = &warmstart {
        let b = b.canonicalize().unwrap_or_else(|_| b.clone());
        // The full binary it hands learning launches and the daemon to.
        if let Some(core) = warmstart_launch::install::core_binary(&b) {
            spec.binds.push(core.canonicalize().unwrap_or(core));
        }
        spec.binds.push(b);
    }
    spec.binds.extend(o.binds.iter().cloned());
    for b in &spec.binds {
        if b.starts_with("/tmp") || b.starts_with("/run") {
            bail!(
                "with --fs, {} cannot be under /tmp or /run (the testbed mounts its own there)",
                b.display()
            );
        }
    }
    if !quiet {
        eprintln!("warmstart: preparing the {fs} testbed (the first build copies the contents)");
    }
    let tb = Testbed::prepare(spec).context("preparing the testbed")?;
    if !quiet {
        match tb.build_reason() {
            Some(why) => eprintln!("warmstart: built {} ({why})", tb.image().display()),
            None => eprintln!("warmstart: reusing {}", tb.image().display()),
        }
    }
    let device = match o.storage {
        Some(p) => {
            if !quiet {
                eprintln!("warmstart: measuring the {p} model with fio");
            }
            let f = tb
                .validate(&Default::default())
                .with_context(|| format!("validating the {p} model with fio"))?;
            if !quiet {
                eprintln!("warmstart: {p}: {f}");
            }
            Some(f)
        }
        None => None,
    };
    let info = TestbedInfo {
        fs: fs.to_string(),
        storage: o.storage.map(|p| p.to_string()),
        image: tb.image().display().to_string(),
        loop_device: tb.loop_device().display().to_string(),
        host_root: tb.root().display().to_string(),
        direct_io: tb.direct_io(),
        description: tb.describe(),
        contents: tb
            .spec()
            .contents
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        device,
    };

    // The harness keeps its private directories in /var/tmp (on disk, not
    // in memory); inside, that is the image's. Leftovers of a killed run
    // are removed first.
    let var_tmp = tb.root().join("var/tmp");
    prepare_var_tmp(&var_tmp)?;
    let out_name = format!("{OUT_PREFIX}out-{}", std::process::id());
    let out_host = var_tmp.join(&out_name);
    std::fs::create_dir(&out_host).with_context(|| format!("creating {}", out_host.display()))?;
    let out_inside = Path::new("/var/tmp").join(&out_name);

    let (ours, theirs) = UnixStream::pair().context("creating the cache socket")?;
    let mut argv = vec![exe.into_os_string()];
    argv.extend(args(&out_host, &out_inside)?);
    let mut cmd = tb.command(&argv);
    cmd.env(ENV_INFO, serde_json::to_string(&info)?);
    cmd.env(ENV_FD, theirs.as_raw_fd().to_string());
    if let Some(b) = &warmstart {
        cmd.env("WARMSTART_BENCH_BIN", b);
    }
    let fd = theirs.as_raw_fd();
    // SAFETY: runs in the forked child before exec: fcntl and prctl are
    // async-signal-safe and touch no memory of ours.
    unsafe {
        cmd.pre_exec(move || {
            // Inherited across exec (UnixStream::pair sets close-on-exec).
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Killed with us, so a killed bench leaves no harness behind
            // holding the testbed's mounts.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The device's counters live as long as the device, not the attachment.
    let stat_before = tb.loop_stat().ok();
    let status = std::thread::scope(|sc| -> Result<std::process::ExitStatus> {
        let mut child = cmd.spawn().context("starting the harness in the testbed")?;
        drop(theirs);
        let tb = &tb;
        sc.spawn(move || serve(tb, ours));
        child
            .wait()
            .context("waiting for the harness in the testbed")
    })?;

    // Ctrl-C reaches the harness inside too, and it dies of it first; a
    // signal to this process alone makes the testbed's handler end the
    // harness. Either way the handler is tearing the testbed down and will
    // end this process: tearing down here waits for it.
    if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
        if [libc::SIGINT, libc::SIGTERM, libc::SIGHUP].contains(&sig) {
            // (What the harness left in the image is removed by the next
            // run, as a killed run's.)
            tb.teardown().context("tearing the testbed down")?;
            return Ok(128 + sig);
        }
    }
    let copied = copy_out(&out_host);
    let _ = std::fs::remove_dir_all(&out_host);
    if !quiet {
        if let (Some(a), Ok(b)) = (stat_before, tb.loop_stat()) {
            eprintln!(
                "warmstart: {} read {:.1} MiB in {} requests over the whole run",
                info.loop_device,
                b.read_sectors.saturating_sub(a.read_sectors) as f64 * 512.0 / 1048576.0,
                b.read_ios.saturating_sub(a.read_ios)
            );
        }
    }
    tb.teardown().context("tearing the testbed down")?;
    copied?;
    Ok(status.code().unwrap_or(2))
}

/// Serves the inner harness's requests to drop caches until it closes the
/// socket.
fn serve(tb: &Testbed, sock: UnixStream) {
    let Ok(mut w) = sock.try_clone() else {
        return;
    };
    for line in BufReader::new(sock).lines() {
        let Ok(line) = line else { break };
        let reply = match line.as_str() {
            "drop" => match tb.drop_caches() {
                Ok(()) => "ok".to_string(),
                Err(e) => e.to_string().replace('\n', " "),
            },
            other => format!("unknown request {other:?}"),
        };
        if writeln!(w, "{reply}").is_err() {
            break;
        }
    }
}

fn prepare_var_tmp(var_tmp: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(var_tmp).with_context(|| format!("creating {}", var_tmp.display()))?;
    std::fs::set_permissions(var_tmp, std::fs::Permissions::from_mode(0o1777))
        .with_context(|| format!("setting the mode of {}", var_tmp.display()))?;
    for e in std::fs::read_dir(var_tmp)
        .with_context(|| format!("reading {}", var_tmp.display()))?
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(OUT_PREFIX) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Ok(())
}

/// The inner harness's arguments: the same options, without the testbed's,
/// exports redirected into `out` (copied out afterwards), and no package
/// installs (the outer harness installed them on the host before the image
/// was checked).
fn inner_args(
    a: &BenchArgs,
    suite: Option<&Path>,
    out: &Path,
    quiet: bool,
) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = Vec::new();
    let mut push = |k: &str, val: Option<String>| {
        v.push(k.into());
        if let Some(x) = val {
            v.push(x.into());
        }
    };
    if quiet {
        push("--quiet", None);
    }
    push("--runs", Some(a.runs.to_string()));
    push("--warmup", Some(a.warmup.to_string()));
    if !a.scenarios.is_empty() {
        let s: Vec<&str> = a.scenarios.iter().map(|s| s.name()).collect();
        push("--scenarios", Some(s.join(",")));
    }
    if a.evict_files {
        push("--evict-files", None);
    }
    push("--ready", Some(a.ready.to_string()));
    if let Some(p) = &a.prepare {
        push("--prepare", Some(p.clone()));
    }
    if let Some(c) = &a.cleanup {
        push("--cleanup", Some(c.clone()));
    }
    push("--timeout", Some(a.timeout.to_string()));
    if a.ignore_failure {
        push("--ignore-failure", None);
    }
    if a.check_residency {
        push("--check-residency", None);
    }
    if let Some(n) = &a.name {
        push("--name", Some(n.clone()));
    }
    if let Some(s) = suite {
        push("--suite", Some(s.display().to_string()));
        if !a.only.is_empty() {
            push("--only", Some(a.only.join(",")));
        }
        push("--no-install", None);
    }
    for (flag, set, file) in [
        ("--export-json", a.export_json.is_some(), "results.json"),
        ("--export-csv", a.export_csv.is_some(), "results.csv"),
        (
            "--export-markdown",
            a.export_markdown.is_some(),
            "results.md",
        ),
        ("--plot", a.plot.is_some(), "plot"),
    ] {
        if set {
            push(flag, Some(out.join(file).display().to_string()));
        }
    }
    if !a.command.is_empty() {
        v.push("--".into());
        v.extend(a.command.iter().map(Into::into));
    }
    v
}

/// Copies the inner harness's exports to where they were asked for.
fn copy_out(a: &BenchArgs, out: &Path) -> Result<()> {
    for (want, file) in [
        (&a.export_json, "results.json"),
        (&a.export_csv, "results.csv"),
        (&a.export_markdown, "results.md"),
    ] {
        let (Some(to), from) = (want, out.join(file)) else {
            continue;
        };
        if from.exists() {
            std::fs::copy(&from, to)
                .with_context(|| format!("writing {}", to.display()))
                .map(|_| ())?;
        }
    }
    if let Some(to) = &a.plot {
        copy_files(&out.join("plot"), to)?;
    }
    Ok(())
}

/// Copies the files of directory `from`, if it exists, into `to`.
pub fn copy_files(from: &Path, to: &Path) -> Result<()> {
    if !from.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from)?.flatten() {
        let dst: PathBuf = to.join(e.file_name());
        std::fs::copy(e.path(), &dst).with_context(|| format!("writing {}", dst.display()))?;
    }
    Ok(())
}

/// Parses `--storage`.
pub fn parse_profile(s: &str) -> Result<Profile, String> {
    s.parse()
        .map_err(|e: warmstart_testbed::Error| e.to_string())
}

/// Parses `--fs`.
pub fn parse_fs(s: &str) -> Result<Fs, String> {
    s.parse()
        .map_err(|e: warmstart_testbed::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// As main.rs's.
    #[derive(Parser)]
    struct Cli {
        #[arg(short, long)]
        quiet: bool,
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("warmstart-bench").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn inner_harness_gets_every_option_but_the_testbeds() {
        let outer = parse(&[
            "--fs",
            "xfs",
            "--storage",
            "sd",
            "--testbed-content",
            "/usr,/etc",
            "--runs",
            "3",
            "--warmup",
            "2",
            "--scenarios",
            "cold,warm,run",
            "--evict-files",
            "--ready",
            "output:Listening on",
            "--prepare",
            "rm -rf /var/tmp/x",
            "--timeout",
            "12.5",
            "-i",
            "--name",
            "srv",
            "--export-json",
            "/home/u/r.json",
            "--plot",
            "figs",
            "--",
            "node",
            "server.js",
            "--port=1",
        ]);
        let argv = inner_args(&outer, None, Path::new("/var/tmp/out"), true);
        let argv: Vec<String> = argv.into_iter().map(|a| a.into_string().unwrap()).collect();
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let inner = parse(&refs);
        assert!(inner.fs.is_none() && inner.storage.is_none());
        assert!(inner.testbed_content.is_empty());
        assert_eq!(inner.runs, 3);
        assert_eq!(inner.warmup, 2);
        assert_eq!(inner.scenarios, outer.scenarios);
        assert!(inner.evict_files && inner.ignore_failure);
        assert_eq!(inner.ready.to_string(), "output:Listening on");
        assert_eq!(inner.prepare, outer.prepare);
        assert_eq!(inner.timeout, 12.5);
        assert_eq!(inner.name.as_deref(), Some("srv"));
        // Exports land in the exchange directory, copied out afterwards.
        assert_eq!(
            inner.export_json.as_deref(),
            Some(Path::new("/var/tmp/out/results.json"))
        );
        assert_eq!(inner.plot.as_deref(), Some(Path::new("/var/tmp/out/plot")));
        assert!(inner.export_csv.is_none());
        assert_eq!(inner.command, ["node", "server.js", "--port=1"]);
        assert!(argv.contains(&"--quiet".to_string()));
    }

    #[test]
    fn inner_suite_run_installs_nothing() {
        let outer = parse(&[
            "--fs",
            "ext4",
            "--suite",
            "bench/suite.toml",
            "--only",
            "a,b",
        ]);
        let argv = inner_args(
            &outer,
            Some(Path::new("/src/bench/suite.toml")),
            Path::new("/o"),
            false,
        );
        let argv: Vec<String> = argv.into_iter().map(|a| a.into_string().unwrap()).collect();
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let inner = parse(&refs);
        assert_eq!(
            inner.suite.as_deref(),
            Some(Path::new("/src/bench/suite.toml"))
        );
        assert_eq!(inner.only, ["a", "b"]);
        assert!(inner.no_install);
        assert!(inner.command.is_empty());
    }

    #[test]
    fn testbed_lines_name_the_image_and_the_device() {
        let mut info = TestbedInfo {
            fs: "xfs".into(),
            storage: Some("sd".into()),
            image: "/var/cache/warmstart-bench/testbed-xfs.img".into(),
            loop_device: "/dev/loop3".into(),
            host_root: "/run/warmstart-testbed/1-0/root".into(),
            direct_io: true,
            description: "xfs image on sd (600 us latency)".into(),
            contents: vec!["/usr".into()],
            device: None,
        };
        assert_eq!(
            info.lines(),
            [
                "testbed: xfs image on sd (600 us latency) (/dev/loop3, image \
              /var/cache/warmstart-bench/testbed-xfs.img)"
            ]
        );
        info.device = Some(DeviceFigures {
            rand4k_qd1_lat_us: 850.0,
            rand4k_qd1_p50_us: 800.0,
            rand4k_qd1_p99_us: 2700.0,
            rand4k_qd1_iops: 1150.0,
            rand4k_qd32_iops: 1200.0,
            seq1m_mb_s: 38.2,
        });
        let l = info.lines();
        assert_eq!(l.len(), 2);
        assert!(
            l[1].starts_with("device (fio on sd): 4k random read QD1 850 us"),
            "{l:?}"
        );

        // In every export.
        let mut r = crate::export::tests::sample();
        r.testbed = Some(info);
        for x in &mut r.programs[0].runs {
            x.device_read_bytes = Some(19_100_000);
        }
        let text = crate::report::render(&r);
        assert!(
            text.starts_with(&format!("{}\n{}\n\n", l[0], l[1])),
            "{text}"
        );
        assert!(
            text.contains(
                "  prefetch-only took 1.00x the time its device bytes take read sequentially"
            ),
            "with fio's figures, each program's standalone replay against them: {text}"
        );
        let md = crate::markdown::render(&r);
        assert!(
            md.contains(
                "- **Testbed:** xfs image on sd (600 us latency) (image \
                 `/var/cache/warmstart-bench/testbed-xfs.img`, contents /usr).\n\
                 - **Device (fio on the loop device):** 4k random read QD1 850 us"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "A standalone replay against a sequential read of its bytes:\n\n\
                 - demo: prefetch-only took 1.00x"
            ),
            "{md}"
        );
        let mut json = Vec::new();
        crate::export::write_json(&r, &mut json).unwrap();
        let back: crate::export::Results = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, r);
    }
}
