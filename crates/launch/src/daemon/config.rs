//! `/etc/warmstart/config.toml`: the daemon's policy and limits, read and
//! validated before anything is traced.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warmstart_predict::PredictorConfig;

use crate::preload::PreloadConfig;
use crate::startup::StartupConfig;

/// `/etc/warmstart/config.toml`. Unknown keys are errors, so a typo is
/// reported instead of silently ignored.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// `all`: learn every program not denied; `allow-list`: only `allow`.
    pub learn: LearnMode,
    /// Globs of executables (or scripts, for interpreters) to learn.
    pub allow: Vec<String>,
    /// Globs never traced, whatever `allow` says.
    pub deny: Vec<String>,
    /// Skip processes in systemd's system.slice (services).
    pub skip_services: bool,
    /// Launches reading less than this are never prefetched.
    pub min_launch_kib: u64,
    /// A program's first launch that ends within this many milliseconds
    /// *and* uses less than `min_learn_kib` of file data gets no profile,
    /// and the program is not followed again for an hour: see
    /// [`DEFAULT_MIN_LEARN_MS`]. 0 learns every launch. Programs named by
    /// an `allow` glob or `warmstart learn` are always learned.
    pub min_learn_ms: u64,
    /// See `min_learn_ms`.
    pub min_learn_kib: u64,
    /// Launches being named, compiled and written at once. Each one reads
    /// the files a launch used and compiles its plan: work that competes
    /// with the applications for the CPU and the disk.
    pub learn_workers: usize,
    pub max_concurrent_replays: usize,
    /// Threads per replay; unset, 8, or 1 and a spare when the plan's
    /// metadata is read from its block devices (see `warmstart_replay::
    /// Options::workers_metadata_read`). Lookups and opens that wait on the disk one
    /// by one want more threads than cores; with their metadata cached,
    /// more threads only take CPU from the launch.
    pub replay_workers: Option<usize>,
    /// Replay stops when MemAvailable would fall below this.
    pub memory_floor_mib: Option<u64>,
    /// `idle` or `be:0`..`be:7`.
    pub io_priority: Option<String>,
    /// CPUs the replays run on: `one` (the last CPU, leaving the others to
    /// the applications), `all`, or a list such as `0,2-3`.
    pub replay_cpus: String,
    /// Start a known program's replay when its execve begins, while the
    /// kernel is still loading it, rather than at its exec event.
    pub replay_at_execve: bool,
    pub state_dir: PathBuf,
    /// Profiles beyond this total size are evicted, least recently used first.
    pub store_max_mib: u64,
    /// Plans held in memory, by their decoded size (a plan file is
    /// compressed: its decoded form can be hundreds of times larger).
    /// Plans beyond it are read from the state directory at each launch.
    pub plan_memory_mib: u64,
    /// A learning launch ends after this many seconds without I/O.
    pub idle_s: f64,
    /// ... or after this many seconds.
    pub timeout_s: f64,
    pub socket: PathBuf,
    /// Keep a launch history (`STATE_DIR/history.jsonl`) and rank the
    /// programs likely to start soon. Off: no history is written, nothing
    /// is predicted, and so nothing is preloaded.
    pub predict_launches: bool,
    /// Startup plans: what a boot or a login reads, replayed at the next.
    pub startup: StartupConfig,
    /// Reading the plans of predicted launches while the machine idles.
    pub preload: PreloadConfig,
    /// The predictor's model and weights.
    pub predict: PredictorConfig,
    /// A repository (`host[:port]/path`) where plans are looked up by
    /// program content for programs without a profile. `None`: no lookups.
    pub registry: Option<String>,
    /// Each request to the registry ends after this many seconds.
    pub registry_timeout_s: u64,
    /// Speak plain HTTP to a registry that is not on loopback (loopback
    /// registries always get HTTP).
    pub registry_plain_http: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LearnMode {
    All,
    AllowList,
}

/// Default `min_learn_ms`. Recorded with `warmstart record`, `true`, `ls`,
/// `cat`, `grep` and `seq` ran 0-15 ms, cold or warm, and used 1.1-2.7 MiB
/// of file data, mostly the C library every program shares; `git
/// --version` ran 3 ms but used 5.4 MiB (3.6 MiB of it from storage when
/// cold), `python3 -c pass` 533 ms and 16.6 MiB. A shell loop runs such
/// tools thousands of times; a profile each would cost a recording per
/// launch and a directory per command line, for nothing to gain.
pub const DEFAULT_MIN_LEARN_MS: u64 = 20;
/// Default `min_learn_kib`: above the 2.7 MiB of the largest trivial tool
/// measured (see [`DEFAULT_MIN_LEARN_MS`]).
pub const DEFAULT_MIN_LEARN_KIB: u64 = 4096;

/// The default control socket: in the directory systemd's
/// `RuntimeDirectory=warmstart` creates (the daemon creates it, 0700, when
/// run by hand).
pub const DEFAULT_SOCKET: &str = "/run/warmstart/warmstart.sock";

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            learn: LearnMode::All,
            allow: Vec::new(),
            deny: [
                "/usr/sbin/*",
                "/sbin/*",
                "/usr/lib/systemd/*",
                "/lib/systemd/*",
                "/usr/libexec/*",
                "*/warmstart",
            ]
            .map(String::from)
            .to_vec(),
            skip_services: true,
            min_launch_kib: 256,
            min_learn_ms: DEFAULT_MIN_LEARN_MS,
            min_learn_kib: DEFAULT_MIN_LEARN_KIB,
            learn_workers: 1,
            max_concurrent_replays: 4,
            replay_workers: None,
            memory_floor_mib: None,
            io_priority: None,
            replay_cpus: "one".into(),
            replay_at_execve: true,
            state_dir: PathBuf::from("/var/lib/warmstart"),
            store_max_mib: 256,
            plan_memory_mib: 64,
            idle_s: 2.0,
            timeout_s: 30.0,
            socket: PathBuf::from(DEFAULT_SOCKET),
            predict_launches: true,
            startup: StartupConfig::default(),
            preload: PreloadConfig::default(),
            predict: PredictorConfig::default(),
            registry: None,
            registry_timeout_s: 5,
            registry_plain_http: false,
        }
    }
}

impl DaemonConfig {
    /// Reads and validates a config file; a missing file means defaults.
    pub fn load(path: &Path) -> Result<DaemonConfig, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(DaemonConfig::default())
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let cfg: DaemonConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        cfg.validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        for g in self.allow.iter().chain(&self.deny) {
            glob::Pattern::new(g).map_err(|e| format!("bad glob {g:?}: {e}"))?;
        }
        if self.learn == LearnMode::AllowList && self.allow.is_empty() {
            return Err("learn = \"allow-list\" with an empty allow list learns nothing".into());
        }
        if self.replay_workers.is_some_and(|w| !(1..=64).contains(&w)) {
            return Err("replay_workers must be between 1 and 64".into());
        }
        if !(1..=16).contains(&self.learn_workers) {
            return Err("learn_workers must be between 1 and 16".into());
        }
        if self.max_concurrent_replays == 0 {
            return Err("max_concurrent_replays must be at least 1".into());
        }
        if let Some(p) = &self.io_priority {
            p.parse::<warmstart_replay::IoPriority>()
                .map_err(|e| format!("io_priority {p:?}: {e}"))?;
        }
        self.replay_cpus
            .parse::<warmstart_replay::ReplayCpus>()
            .map_err(|e| format!("replay_cpus: {e}"))?;
        if !(self.idle_s > 0.0 && self.timeout_s >= self.idle_s && self.timeout_s <= 1e6) {
            return Err("need 0 < idle_s <= timeout_s <= 1000000 (seconds)".into());
        }
        if let Some(r) = &self.registry {
            // The full reference is parsed by the lookup; here the shape:
            // a repository, not one plan.
            if r.is_empty() || r.contains(char::is_whitespace) || r.contains('@') {
                return Err(format!(
                    "registry {r:?}: give a repository, host[:port]/path"
                ));
            }
        }
        if !(1..=300).contains(&self.registry_timeout_s) {
            return Err("registry_timeout_s must be between 1 and 300".into());
        }
        self.startup.validate()?;
        self.preload.validate()?;
        let p = &self.predict;
        if !(p.decay > 0.0 && p.decay <= 1.0) || p.max_profiles == 0 {
            return Err("predict: need 0 < decay <= 1 and max_profiles >= 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        assert!(
            DaemonConfig::load(&d.path().join("none.toml")).is_ok(),
            "missing file: defaults"
        );
        let cases = [
            ("learn = \"all\"\ndeny = [\"/x/*\"]\n", None),
            ("lern = \"all\"\n", Some("unknown field")),
            ("learn = \"allow-list\"\n", Some("empty allow list")),
            ("allow = [\"[\"]\n", Some("bad glob")),
            ("max_concurrent_replays = 0\n", Some("at least 1")),
            ("learn_workers = 0\n", Some("learn_workers")),
            ("replay_workers = 0\n", Some("replay_workers")),
            ("replay_workers = 65\n", Some("replay_workers")),
            ("replay_workers = 4\n", None),
            ("learn_workers = 2\nmin_learn_ms = 0\n", None),
            ("io_priority = \"fast\"\n", Some("io_priority")),
            ("replay_cpus = \"1,3-4\"\n", None),
            ("replay_cpus = \"two\"\n", Some("replay_cpus")),
            ("[startup]\nenabled = false\n", None),
            ("[startup]\nquiet_s = 0\n", Some("quiet_s")),
            ("[preload]\nbudget_fraction = 2\n", Some("budget_fraction")),
            ("[preload]\nenable = false\n", Some("unknown field")),
            (
                "predict_launches = false\n[predict]\nmodel = \"markov\"\n",
                None,
            ),
            ("[predict]\ndecay = 0\n", Some("decay")),
            ("registry = \"127.0.0.1:5000/plans\"\n", None),
            ("registry = \"r.example/p@sha256:00\"\n", Some("registry")),
            ("registry_timeout_s = 0\n", Some("registry_timeout_s")),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            match (DaemonConfig::load(&p), want) {
                (Ok(_), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{text}: {e}"),
                (r, w) => panic!("{text}: got {r:?}, wanted {w:?}"),
            }
        }
    }

    #[test]
    fn the_shipped_config_is_valid_and_says_the_defaults() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/config.toml");
        let c = DaemonConfig::load(&p).unwrap();
        let d = DaemonConfig::default();
        assert_eq!(c.learn, LearnMode::All);
        assert!(!c.allows("/usr/sbin/cron"));
        // The file documents the defaults: it must not drift from them.
        assert_eq!(c.socket, d.socket);
        assert_eq!(c.min_learn_ms, d.min_learn_ms);
        assert_eq!(c.min_learn_kib, d.min_learn_kib);
        assert_eq!(c.learn_workers, d.learn_workers);
        assert_eq!(c.replay_workers, d.replay_workers);
        assert_eq!(c.plan_memory_mib, d.plan_memory_mib);
        assert_eq!(c.predict_launches, d.predict_launches);
        assert_eq!(c.startup, d.startup);
        assert_eq!(c.preload, d.preload);
        assert_eq!(c.predict, d.predict);
        assert_eq!(c.registry, d.registry);
        assert_eq!(c.registry_timeout_s, d.registry_timeout_s);
        assert_eq!(c.registry_plain_http, d.registry_plain_http);
    }
}
