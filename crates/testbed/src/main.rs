//! `warmstart-testbed`: prepare, use, measure and clean up storage
//! testbeds by hand; the bench drives the same library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use warmstart_testbed::{
    cleanup, cleanup_leftovers, FioOptions, Fs, Profile, Testbed, TestbedSpec, DEFAULT_CACHE_DIR,
};

/// Storage testbeds for warmstart's bench: a filesystem image on a loop
/// device with direct I/O, optionally on a simulated slow device.
#[derive(Parser)]
#[command(
    version,
    after_help = "EXAMPLES:\n    \
    warmstart-testbed run --fs xfs --storage sd -- python3 -c 'import json'\n    \
    warmstart-testbed validate --fs ext4 --storage cloud\n    \
    warmstart-testbed cleanup"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args)]
struct SpecArgs {
    /// Filesystem of the image: ext4, xfs or btrfs.
    #[arg(long, default_value = "ext4")]
    fs: Fs,
    /// Slow-storage profile under the image: sd, cloud, sata-ssd or hdd.
    #[arg(long)]
    storage: Option<Profile>,
    /// Host path to copy into the image (repeat; default /usr, /etc, /bin,
    /// /sbin, /lib*).
    #[arg(long = "content")]
    contents: Vec<PathBuf>,
    /// Image size in MiB (default: the contents' size plus room).
    #[arg(long)]
    size_mib: Option<u64>,
    /// Where images are cached.
    #[arg(long, default_value = DEFAULT_CACHE_DIR)]
    cache_dir: PathBuf,
    /// Host path bind-mounted at the same path inside (repeat).
    #[arg(long = "bind")]
    binds: Vec<PathBuf>,
}

impl SpecArgs {
    fn spec(self) -> TestbedSpec {
        let mut spec = TestbedSpec::new(self.fs);
        spec.storage = self.storage;
        if !self.contents.is_empty() {
            spec.contents = self.contents;
        }
        spec.size = self.size_mib.map(|m| m << 20);
        spec.cache_dir = self.cache_dir;
        spec.binds = self.binds;
        spec
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the image if needed and print where the testbed is mounted.
    Prepare {
        #[command(flatten)]
        spec: SpecArgs,
        /// Keep the testbed mounted until interrupted.
        #[arg(long)]
        hold: bool,
    },
    /// Run a command inside the testbed, cold (caches dropped first).
    Run {
        #[command(flatten)]
        spec: SpecArgs,
        /// Do not drop caches first.
        #[arg(long)]
        warm: bool,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// Measure the testbed's device with fio.
    Validate {
        #[command(flatten)]
        spec: SpecArgs,
        /// Seconds each fio job runs.
        #[arg(long, default_value_t = 5)]
        runtime: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove leftovers of interrupted runs and the cached images.
    Cleanup {
        /// Where images are cached.
        #[arg(long, default_value = DEFAULT_CACHE_DIR)]
        cache_dir: PathBuf,
        /// Keep the cached images; remove only what killed runs left.
        #[arg(long)]
        keep_images: bool,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warmstart-testbed: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<ExitCode> {
    match Cli::parse().command {
        Cmd::Prepare { spec, hold } => {
            let tb = Testbed::prepare(spec.spec()).context("preparing the testbed")?;
            println!(
                "{} on {} ({}; direct I/O {}) at {}",
                tb.image().display(),
                tb.loop_device().display(),
                tb.build_reason()
                    .map_or("reused".to_string(), |why| format!("built: {why}")),
                if tb.direct_io() { "on" } else { "off" },
                tb.root().display()
            );
            if hold {
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            tb.teardown().context("tearing the testbed down")?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { spec, warm, argv } => {
            let tb = Testbed::prepare(spec.spec()).context("preparing the testbed")?;
            if !warm {
                tb.drop_caches().context("dropping caches")?;
            }
            let status = tb
                .command(&argv)
                .status()
                .with_context(|| format!("running {argv:?} in the testbed"))?;
            tb.teardown().context("tearing the testbed down")?;
            Ok(ExitCode::from(status.code().unwrap_or(1) as u8))
        }
        Cmd::Validate {
            spec,
            runtime,
            json,
        } => {
            let tb = Testbed::prepare(spec.spec()).context("preparing the testbed")?;
            let figures = tb
                .validate(&FioOptions {
                    runtime: Duration::from_secs(runtime),
                })
                .context("measuring with fio")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&figures)?);
            } else {
                let what = tb
                    .spec()
                    .storage
                    .map_or("host disk".to_string(), |p| p.to_string());
                println!("{} on {what}: {figures}", tb.spec().fs);
            }
            tb.teardown().context("tearing the testbed down")?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cleanup {
            cache_dir,
            keep_images,
        } => {
            let r = if keep_images {
                cleanup_leftovers(&cache_dir)
            } else {
                cleanup(&cache_dir)
            }
            .context("cleaning up")?;
            for p in &r.unmounted {
                println!("unmounted {}", p.display());
            }
            for p in &r.detached {
                println!("detached {}", p.display());
            }
            for p in &r.removed {
                println!("removed {}", p.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
