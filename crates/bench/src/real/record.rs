//! Recording one launch with warmstart's recorder, in the target's
//! working directory and environment, until it is ready.

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warmstart_plan::trace::CacheState;
use warmstart_plan::Trace;

use super::RealExecutor;
use crate::launch::{Launched, Ready};
use crate::os;

impl RealExecutor {
    /// Records one launch; returns the trace and the launch time (exec to
    /// readiness).
    pub(super) fn record(&self, cache: CacheState) -> Result<(Trace, Launched, Vec<String>)> {
        self.record_split(cache, None)
    }

    /// [`Self::record`], with pages used `split` ns apart kept in separate
    /// extents.
    pub(super) fn record_split(
        &self,
        cache: CacheState,
        split: Option<u64>,
    ) -> Result<(Trace, Launched, Vec<String>)> {
        let opts = warmstart_record::Options {
            split_extents_ns: split,
            backend: self.cfg.backend,
            // Recording ends when the launch is complete (the probe stops
            // the program if it stays up), not on a pause in its I/O.
            idle: self.target.timeout,
            timeout: self.target.timeout,
            cache,
        };
        let ready = self.target.ready.clone();
        ready.reset();
        let timeout = self.target.timeout;
        let result: Arc<Mutex<Option<(Duration, bool)>>> = Arc::new(Mutex::new(None));
        // An output pattern is watched on a pipe that replaces our stdout
        // and stderr while the recorder forks the command.
        let matched = Arc::new(AtomicBool::new(false));
        let mut pipe_w = None;
        let mut reader = None;
        if let Ready::Output(re) = &ready {
            let (r, w) = os::pipe()?;
            pipe_w = Some(w);
            let (re, m) = (re.clone(), Arc::clone(&matched));
            reader = Some(thread::spawn(move || {
                let mut r = BufReader::new(std::fs::File::from(r));
                let mut line = Vec::new();
                while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                    if re.is_match(&String::from_utf8_lossy(&line)) {
                        m.store(true, Ordering::Relaxed);
                    }
                    line.clear();
                }
            }));
        }
        // Watching before the fork: no window is mapped unseen.
        let mut watch = self.target.window_watch()?;
        let mut probe = None;
        let _dir = CwdGuard::enter(self.target.cwd.as_deref())?;
        let _env = EnvGuard::set(&self.target.env);
        let recorded = {
            let show = std::env::var_os("WARMSTART_BENCH_SHOW_OUTPUT").is_some();
            let _quiet = if pipe_w.is_some() || !show {
                Some(os::Silence::new(pipe_w.as_ref())?)
            } else {
                None
            };
            warmstart_record::record(&self.target.argv, &opts, |pid| {
                let t0 = Instant::now();
                let out = Arc::clone(&result);
                let matched = Arc::clone(&matched);
                let pidfd = os::pidfd_open(pid).ok();
                let mut watch = watch.take();
                probe = Some(thread::spawn(move || {
                    let deadline = t0 + timeout;
                    let ok = match (&ready, &pidfd) {
                        (Ready::Exit, Some(fd)) => os::wait_readable(fd, deadline),
                        _ => loop {
                            let up = match &ready {
                                Ready::Output(_) => matched.load(Ordering::Relaxed),
                                Ready::Window(_) => {
                                    watch.as_mut().is_some_and(|w| w.ready().unwrap_or(false))
                                }
                                r => r.poll() == Some(true),
                            };
                            if up {
                                break true;
                            }
                            // Exited without becoming ready: no use waiting
                            // (for output, the last lines may still be on
                            // their way through the pipe).
                            if !matches!(ready, Ready::Output(_))
                                && pidfd
                                    .as_ref()
                                    .is_some_and(|fd| os::wait_readable(fd, Instant::now()))
                            {
                                break false;
                            }
                            if Instant::now() >= deadline {
                                break false;
                            }
                            match &watch {
                                Some(w) => w.wait(pidfd.as_ref().map(|f| f.as_fd()), deadline),
                                None => thread::sleep(ready.interval()),
                            }
                        },
                    };
                    *out.lock().unwrap_or_else(|e| e.into_inner()) = Some((t0.elapsed(), ok));
                    if !matches!(ready, Ready::Exit) || !ok {
                        os::signal_tree(pid, libc::SIGTERM);
                        thread::sleep(Duration::from_millis(500));
                        os::signal_tree(pid, libc::SIGKILL);
                    }
                }));
            })
            .with_context(|| format!("recording {}", self.target.argv.join(" ")))?
        };
        // Our copy of the write end must go for the reader to see EOF.
        drop(pipe_w);
        if let Some(p) = probe {
            let _ = p.join();
        }
        let trace = recorded.trace.clone();
        if let Some(r) = reader {
            let _ = r.join();
        }
        let fallbacks = recorded.fallbacks.clone();
        let exit = recorded.wait()?;
        let (time, ok) = result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or((Duration::ZERO, false));
        if !ok {
            bail!(
                "{} was not ready ({}) within {:.0}s while recording",
                self.target.name,
                self.target.ready,
                timeout.as_secs_f64()
            );
        }
        let exit_code = matches!(self.target.ready, Ready::Exit).then(|| exit.shell_code());
        Ok((trace, Launched { time, exit_code }, fallbacks))
    }
}

/// Changes the working directory for a recorded launch (the recorder forks
/// with ours) and changes it back.
struct CwdGuard(Option<std::path::PathBuf>);

impl CwdGuard {
    fn enter(dir: Option<&Path>) -> Result<CwdGuard> {
        let Some(d) = dir else {
            return Ok(CwdGuard(None));
        };
        let old = std::env::current_dir()?;
        std::env::set_current_dir(d).with_context(|| format!("entering {}", d.display()))?;
        Ok(CwdGuard(Some(old)))
    }
}

impl Drop for CwdGuard {
    fn drop(&mut self) {
        if let Some(o) = &self.0 {
            let _ = std::env::set_current_dir(o);
        }
    }
}

/// Sets environment variables for a recorded launch and restores them.
struct EnvGuard(Vec<(String, Option<std::ffi::OsString>)>);

impl EnvGuard {
    fn set(vars: &[(String, String)]) -> EnvGuard {
        let mut old = Vec::new();
        for (k, v) in vars {
            old.push((k.clone(), std::env::var_os(k)));
            std::env::set_var(k, v);
        }
        EnvGuard(old)
    }
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}
