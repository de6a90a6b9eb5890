//! The `warmstart` command: one module per subcommand under `cmd/`.
//!
//! Two binaries share it. `warmstart` ([`front`]) is what users run: it is
//! small, because `warmstart run` reads it from a cold disk before every
//! launch it wraps, and it runs a prefetched launch itself. Everything else
//! — the other commands, and launches that record — it hands over to
//! `warmstart-core` ([`core_main`]), which links the recorder, the daemon
//! and the registry client.

mod cli;
mod cmd;
pub mod front;
mod handover;

use cli::Command;

/// `warmstart-core`'s `main`: every command.
pub fn core_main() -> ! {
    handover::take_mark();
    let cli = cli::Cli::parse_args();
    if matches!(
        cli.command,
        Command::Show(_)
            | Command::Status(_)
            | Command::Compile(_)
            | Command::Replay(_)
            | Command::Forget(_)
            | Command::Learn(_)
    ) {
        // Commands that only print: a reader that stops reading
        // (`warmstart show t.trace | head`) ends them quietly, as it ends
        // any Unix tool. Rust's runtime ignores SIGPIPE, and println! then
        // panics. The wrappers and the daemon keep ignoring it: they must
        // outlive a closed pipe to finish their launch or serve others.
        // SAFETY: setting a signal disposition to its default, before any
        // thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    exit_with(cmd::dispatch(cli))
}

/// Exits with a command's code, or says what went wrong.
fn exit_with(result: anyhow::Result<i32>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        // The same for the others, where the closed pipe comes back as an
        // error: 141 is what a shell reports for a command SIGPIPE ended.
        Err(err) if is_broken_pipe(&err) => std::process::exit(141),
        Err(err) => {
            eprintln!("warmstart: {}", describe(&err));
            std::process::exit(shell_code(&err).unwrap_or(2));
        }
    }
}

/// For a command `run`, `record` or `stream` could not start, the status
/// a shell reports: 127 not found, 126 not runnable.
fn shell_code(err: &anyhow::Error) -> Option<i32> {
    err.downcast_ref::<warmstart_launch::Error>()
        .and_then(warmstart_launch::Error::shell_code)
        .or_else(|| {
            err.downcast_ref::<warmstart_record::Error>()
                .and_then(warmstart_record::Error::shell_code)
        })
        .or_else(|| {
            err.downcast_ref::<warmstart_stream::Error>()
                .and_then(warmstart_stream::Error::shell_code)
        })
}

/// The error and its causes in one line, like `{:#}`, but a cause whose
/// text its parent already ends with is not said twice (many errors put
/// their source in their own message).
pub(crate) fn describe(err: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(pipe)
            // csv and serde_json keep the I/O error inside, not as source.
            || e.downcast_ref::<csv::Error>()
                .is_some_and(|e| matches!(e.kind(), csv::ErrorKind::Io(e) if pipe(e)))
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}
