//! libbpf's messages while the programs load, kept instead of printed, so
//! that a refused load names the program and the kernel's reason in one
//! line (the verifier's log runs to hundreds), and a refusal the recorder
//! works around (fentry on a kernel that allows tracepoints only) prints
//! nothing. `WARMSTART_BPF_LOG=1` prints them as they come.

use std::sync::{Mutex, MutexGuard};

use libbpf_rs::{PrintCallback, PrintLevel};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// One capture at a time: the print callback is the process's.
static ONE: Mutex<()> = Mutex::new(());

fn keep(level: PrintLevel, msg: String) {
    if std::env::var_os("WARMSTART_BPF_LOG").is_some() {
        eprint!("{msg}");
    }
    if level == PrintLevel::Debug {
        return;
    }
    let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
    // A verifier log can be long; its end says why.
    if lines.len() > 4096 {
        lines.drain(..2048);
    }
    lines.extend(msg.lines().map(str::to_string));
}

/// Captures libbpf's messages until dropped.
pub(crate) struct Capture {
    previous: Option<(PrintLevel, PrintCallback)>,
    _one: MutexGuard<'static, ()>,
}

impl Capture {
    pub(crate) fn start() -> Capture {
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        LINES.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let level = if std::env::var_os("WARMSTART_BPF_LOG").is_some() {
            PrintLevel::Debug
        } else {
            PrintLevel::Warn
        };
        let previous = libbpf_rs::set_print(Some((level, keep as PrintCallback)));
        Capture {
            previous,
            _one: one,
        }
    }

    /// The program libbpf last complained about, and the kernel's reason.
    pub(crate) fn culprit(&self) -> (Option<String>, Option<String>) {
        culprit(&LINES.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        libbpf_rs::set_print(self.previous.take());
    }
}

/// From libbpf's lines: the last `prog 'NAME'` named, and the reason: the
/// verifier's last words before the end of its log, else libbpf's own.
fn culprit(lines: &[String]) -> (Option<String>, Option<String>) {
    let program = lines.iter().rev().find_map(|l| {
        let rest = &l[l.find("prog '")? + 6..];
        Some(rest[..rest.find('\'')?].to_string())
    });
    let in_log = lines
        .iter()
        .position(|l| l.contains("-- END PROG LOAD LOG --"))
        .and_then(|end| {
            lines[..end].iter().rev().find(|l| {
                let t = l.trim();
                !t.is_empty()
                    && !t.starts_with("processed ")
                    && !t.starts_with("verification time")
                    && !t.starts_with("stack depth")
            })
        });
    let detail = in_log
        .or_else(|| lines.iter().rev().find(|l| !l.contains("-- ")))
        .map(|l| {
            l.trim()
                .trim_start_matches("libbpf: ")
                .trim_end_matches('\n')
                .to_string()
        });
    (program, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_verifier_refusal_names_the_program_and_its_reason() {
        let log = lines(
            "libbpf: prog 'handle_exit': BPF program load failed: Invalid argument\n\
             libbpf: prog 'handle_exit': -- BEGIN PROG LOAD LOG --\n\
             func 'sched_process_exit' doesn't have 2-th argument\n\
             invalid bpf_context access off=8 size=1\n\
             processed 3 insns (limit 1000000)\n\
             -- END PROG LOAD LOG --\n\
             libbpf: prog 'handle_exit': failed to load: -22\n\
             libbpf: failed to load object 'record_bpf'",
        );
        let (p, d) = culprit(&log);
        assert_eq!(p.as_deref(), Some("handle_exit"));
        assert_eq!(
            d.as_deref(),
            Some("invalid bpf_context access off=8 size=1")
        );
    }

    #[test]
    fn without_a_verifier_log_libbpf_s_last_line_is_the_reason() {
        let log = lines(
            "libbpf: prog 'use_read': failed to find kernel BTF type ID of 'filemap_read': -3\n\
             libbpf: prog 'use_read': failed to prepare load attributes: -3",
        );
        let (p, d) = culprit(&log);
        assert_eq!(p.as_deref(), Some("use_read"));
        assert_eq!(
            d.as_deref(),
            Some("prog 'use_read': failed to prepare load attributes: -3")
        );
        assert_eq!(culprit(&[]), (None, None));
    }
}
