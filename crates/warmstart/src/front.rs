//! The `warmstart` binary users run. `warmstart run` is on every wrapped
//! launch's path, and on a cold disk its binary is read before anything
//! else can happen; this disk reads an executable whole (8 MiB
//! read-ahead), so every megabyte costs the launch. This binary therefore
//! links only what a prefetched launch needs, and hands everything else —
//! the other commands, and launches that record (learning, audits,
//! breakdowns) — to `warmstart-core`, installed beside it (the build tree)
//! or in `../lib/warmstart/` (`/usr/bin` → `/usr/lib/warmstart`).
//!
//! A hand-over is an exec with the same arguments: the core parses them
//! again and does the whole command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use warmstart_launch::install::{core_binary, lib_dir, CORE_BIN};

use crate::cli::{Cli, Command};
use crate::cmd;
use crate::handover::HANDED_OVER;

/// `warmstart`'s `main`.
pub fn main() -> ! {
    if std::env::var_os(HANDED_OVER).is_some() {
        eprintln!(
            "warmstart: {} is the front binary, installed where {CORE_BIN} belongs; \
             reinstall warmstart",
            current_exe().display()
        );
        std::process::exit(2);
    }
    match Cli::parse_front() {
        Some(Cli {
            quiet,
            command: Command::Run(args),
        }) => {
            let command = args.command.clone();
            match cmd::manage::run_front(args, quiet) {
                Ok(Some(code)) => std::process::exit(code),
                Ok(None) => hand_over_launch(&command),
                Err(e) => crate::exit_with(Err(e)),
            }
        }
        Some(Cli {
            quiet,
            command: Command::Bench(args),
        }) => crate::exit_with(cmd::bench::run(args, quiet)),
        _ => hand_over(),
    }
}

/// Every other command: the core does it, or it cannot be done.
fn hand_over() -> ! {
    let why = exec_core();
    eprintln!("warmstart: this command needs {CORE_BIN}: {why}");
    std::process::exit(2);
}

/// A launch that needs the recorder: the core runs it. Without the core,
/// the command still runs, unmanaged.
fn hand_over_launch(command: &[OsString]) -> ! {
    let why = exec_core();
    eprintln!("warmstart: {why}; launching without learning or prefetching");
    let err = warmstart_record::exec_in_place(None, command);
    crate::exit_with(Err(anyhow::Error::new(warmstart_launch::Error::Spawn {
        cmd: warmstart_record::argv_text(command).join(" "),
        source: err,
    })))
}

/// Replaces this process with the core, given the same arguments; returns
/// only when that fails, saying why.
fn exec_core() -> String {
    let exe = current_exe();
    let Some(core) = core_binary(&exe) else {
        return format!(
            "{CORE_BIN} is neither beside {} nor in {} (reinstall warmstart)",
            exe.display(),
            lib_dir(&exe).display()
        );
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| OsString::from("warmstart"));
    let err = std::process::Command::new(&core)
        .arg0(argv0)
        .args(args)
        .env(HANDED_OVER, "1")
        .exec();
    format!("cannot run {}: {err}", core.display())
}

fn current_exe() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/bin/warmstart"))
}
