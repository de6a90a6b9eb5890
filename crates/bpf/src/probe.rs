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

/// Whether some `events/CATEGORY/NAME` exists; None if tracefs is not mounted.
fn tracefs_has(name: &str) -> Option<bool> {
    let events = tracefs_root().join("events");
    let rd = std::fs::read_dir(&events).ok()?;
    Some(rd.flatten().any(|cat| cat.path().join(name).is_dir()))
}

fn btf_has(name: &str) -> bool {
    // A raw scan of the BTF string section: the typedef btf_trace_<tp> exists
    // exactly when the tracepoint can be attached as tp_btf. The file is
    // read once per process.
    static BTF: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let btf =
        BTF.get_or_init(|| std::fs::read(Path::new("/sys/kernel/btf/vmlinux")).unwrap_or_default());
    let mut needle = Vec::with_capacity(name.len() + 2);
    needle.push(0);
    needle.extend_from_slice(name.as_bytes());
    needle.push(0);
    memchr::memmem::find(btf, &needle).is_some()
}

/// Whether BTF for the running kernel is present (needed by CO-RE and tp_btf).
pub fn has_btf() -> bool {
    Path::new("/sys/kernel/btf/vmlinux").exists()
}
