//! Probing the running kernel for the hooks the recorder uses, so programs
//! can be switched off (`set_autoload(false)`) instead of comparing versions.

use std::path::Path;

use crate::tracefs::tracefs_root;

/// Whether this process may load BPF programs (root, or CAP_BPF with CAP_PERFMON).
pub fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    // CapEff bits: CAP_PERFMON = 38, CAP_BPF = 39, CAP_SYS_ADMIN = 21.
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
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
        return btf_has(&format!("btf_trace_{name}"));
    }
    true
}

fn btf_has(name: &str) -> bool {
    // A raw scan of the BTF string section: the typedef btf_trace_<tp> exists
    // exactly when the tracepoint can be attached as tp_btf.
    let Ok(btf) = std::fs::read(Path::new("/sys/kernel/btf/vmlinux")) else {
        return false;
    };
    let needle = {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        n
    };
    btf.windows(needle.len()).any(|w| w == needle.as_slice())
}

/// Whether BTF for the running kernel is present (needed by CO-RE and tp_btf).
pub fn has_btf() -> bool {
    Path::new("/sys/kernel/btf/vmlinux").exists()
}
