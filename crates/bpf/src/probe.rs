//! Probing the running kernel for the hooks the recorder uses, so programs
//! can be switched off (`set_autoload(false)`) instead of comparing versions.

use std::path::Path;

use crate::tracefs::tracefs_root;

/// Whether this process may load BPF programs: CAP_BPF with CAP_PERFMON,
/// or CAP_SYS_ADMIN, in its effective set. Root is asked too: a root whose
/// bounding set lacks them (a sandboxed unit, a container) may not.
pub fn privileged() -> bool {
    // CapEff bits: CAP_PERFMON = 38, CAP_BPF = 39, CAP_SYS_ADMIN = 21.
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        return unsafe { libc::geteuid() } == 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| {
            caps & (1 << 21) != 0 || (caps & (1 << 38) != 0 && caps & (1 << 39) != 0)
        })
}

/// Whether the hook named by a BPF section (`tp/CAT/NAME` or `tp_btf/NAME`)
/// exists on this kernel.
pub fn hook_available(section: &str) -> bool {
    if let Some(rest) = section.strip_prefix("tp/") {
        return tracefs_root().join("events").join(rest).join("id").exists();
    }
    if let Some(name) = section.strip_prefix("tp_btf/") {
        // The tracepoint's tracefs directory, when tracefs is mounted, is a
        // cheap answer; otherwise scan BTF (6 MB, ~30 ms) for its typedef.
        if let Some(found) = tracefs_has(name) {
            return found;
        }
        return btf_has(&format!("btf_trace_{name}"));
    }
    true
}

/// Whether some `events/CATEGORY/NAME` exists; None if tracefs is not
/// mounted. The names are listed once per process: the recorder asks for
/// each of its programs, and each answer walked every category.
fn tracefs_has(name: &str) -> Option<bool> {
    static EVENTS: std::sync::OnceLock<Option<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let events = EVENTS.get_or_init(|| {
        let rd = std::fs::read_dir(tracefs_root().join("events")).ok()?;
        let mut names = std::collections::HashSet::new();
        for cat in rd.flatten().filter(|c| c.path().is_dir()) {
            for ev in std::fs::read_dir(cat.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                names.insert(ev.file_name().to_string_lossy().into_owned());
            }
        }
        Some(names)
    });
    events.as_ref().map(|e| e.contains(name))
}

/// Whether the kernel's BTF has the typedef `btf_trace_<tp>`, which exists
/// exactly when the tracepoint can be attached as tp_btf. The BTF is
/// parsed once per process, with what else the recorder asks of it.
fn btf_has(name: &str) -> bool {
    crate::kernel::btf_tracepoint(name.strip_prefix("btf_trace_").unwrap_or(name))
}

/// Whether BTF for the running kernel is present (needed by CO-RE and tp_btf).
pub fn has_btf() -> bool {
    Path::new("/sys/kernel/btf/vmlinux").exists()
}
