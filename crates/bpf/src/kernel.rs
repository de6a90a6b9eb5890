//! What the running kernel offers the BPF programs, read from its BTF, and
//! which variant of each program it takes (the variants are described in
//! record.bpf.c, "Kernels before today's"). Nothing here compares version
//! numbers: a distribution kernel backports features, and only its BTF
//! says what it has.

use std::sync::OnceLock;

use libbpf_rs::btf::types::{Func, FuncProto, Ptr, Typedef};
use libbpf_rs::btf::{Btf, ReferencesType};

use crate::probe;

/// The running kernel's features the recorder chooses by. What every load
/// needs is answered cheaply (tracefs, a helper probe); the rest from a
/// parse of the kernel's BTF (13 ms here), made only when asked.
#[derive(Debug)]
pub struct Kernel {
    /// `uname -r`, for messages.
    pub release: String,
    /// BTF at /sys/kernel/btf/vmlinux (CO-RE and tp_btf need it).
    pub btf: bool,
    /// sched_process_exit passes `group_dead` (6.16 and later).
    pub exit_group_dead: bool,
    /// The bpf_loop helper (5.17 and later).
    pub bpf_loop: bool,
    /// The tracepoints that report pages used from the cache (6.12 and
    /// later): `mm_filemap_get_pages`, `_map_pages`, `_fault`.
    pub use_tracepoints: [bool; 3],
    /// What only a BTF parse tells: set here by tests and the compat
    /// override, else the process's [`DEEP`].
    deep: Option<Deep>,
}

/// From the kernel's BTF, parsed when first asked (13 ms here): on a
/// kernel with the page-use tracepoints and tracefs mounted, never.
#[derive(Debug, Clone, Default)]
struct Deep {
    /// sched_process_exit passes `group_dead`.
    exit_group_dead: bool,
    /// sched_switch passes `prev_state` (5.18 and later).
    switch_prev_state: bool,
    /// Which page-cache functions exist for fentry.
    use_functions: UseFunctions,
    /// The tracepoints a tp_btf program can attach to (their
    /// `btf_trace_NAME` typedefs).
    tracepoints: std::collections::HashSet<String>,
}

static DEEP: OnceLock<Deep> = OnceLock::new();

fn deep_of_running_kernel() -> &'static Deep {
    DEEP.get_or_init(|| {
        let Ok(btf) = Btf::from_vmlinux() else {
            return Deep::default();
        };
        let func = |name: &str| btf.type_by_name::<Func>(name).is_some();
        Deep {
            exit_group_dead: tracepoint_args(&btf, "sched_process_exit") == Some(2),
            switch_prev_state: tracepoint_args(&btf, "sched_switch") == Some(4),
            use_functions: UseFunctions {
                filemap_read: func("filemap_read"),
                generic_file_buffered_read: func("generic_file_buffered_read"),
                filemap_map_pages: func("filemap_map_pages"),
                filemap_fault: func("filemap_fault"),
            },
            tracepoints: btf
                .type_by_kind::<Typedef>()
                .filter_map(|t| {
                    let name = t.name()?.to_str()?;
                    Some(name.strip_prefix("btf_trace_")?.to_string())
                })
                .collect(),
        }
    })
}

/// Whether the running kernel has tracepoint `name` for tp_btf programs,
/// from its BTF (for when tracefs is not mounted to say).
pub(crate) fn btf_tracepoint(name: &str) -> bool {
    deep_of_running_kernel().tracepoints.contains(name)
}

/// Which page-cache functions exist to attach fentry programs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UseFunctions {
    pub filemap_read: bool,
    pub generic_file_buffered_read: bool,
    pub filemap_map_pages: bool,
    pub filemap_fault: bool,
}

/// The tracepoints that report page uses, in `Kernel::use_tracepoints` order.
pub const USE_TRACEPOINTS: [&str; 3] = [
    "mm_filemap_get_pages",
    "mm_filemap_map_pages",
    "mm_filemap_fault",
];

impl Kernel {
    /// The running kernel, probed once per process.
    ///
    /// `WARMSTART_BPF_COMPAT=1` takes the variants of kernels before 5.17
    /// on any kernel (no bpf_loop, no group_dead, no prev_state): the
    /// variants every kernel accepts, tested on the development kernel.
    pub fn running() -> &'static Kernel {
        static KERNEL: OnceLock<Kernel> = OnceLock::new();
        KERNEL.get_or_init(|| {
            let mut k = Kernel::probe();
            if std::env::var_os("WARMSTART_BPF_COMPAT").is_some_and(|v| v == "1") {
                k.bpf_loop = false;
                k.exit_group_dead = false;
                let mut deep = k.deep().clone();
                deep.switch_prev_state = false;
                k.deep = Some(deep);
            }
            k
        })
    }

    fn probe() -> Kernel {
        let release = nix_release();
        let btf = probe::has_btf();
        // The event's format lists group_dead where the tracepoint passes it.
        let exit_group_dead = match std::fs::read_to_string(
            crate::tracefs_root().join("events/sched/sched_process_exit/format"),
        ) {
            Ok(format) => format.contains("group_dead"),
            Err(_) => deep_of_running_kernel().exit_group_dead,
        };
        let k = Kernel {
            release,
            btf,
            exit_group_dead,
            bpf_loop: helper_exists(libbpf_rs::libbpf_sys::BPF_FUNC_loop),
            use_tracepoints: USE_TRACEPOINTS
                .map(|tp| probe::hook_available(&format!("tp_btf/{tp}"))),
            deep: (!btf).then(Deep::default),
        };
        k
    }

    fn deep(&self) -> &Deep {
        self.deep
            .as_ref()
            .unwrap_or_else(|| deep_of_running_kernel())
    }

    /// sched_switch passes `prev_state` (5.18 and later).
    pub fn switch_prev_state(&self) -> bool {
        self.deep().switch_prev_state
    }

    /// Page-cache functions that fentry programs stand in for the use
    /// tracepoints on: `filemap_read` (5.12+), or
    /// `generic_file_buffered_read` before it, `filemap_map_pages`,
    /// `filemap_fault`.
    pub fn use_functions(&self) -> &UseFunctions {
        &self.deep().use_functions
    }

    /// Whether every page-use tracepoint exists: the recorder then sees
    /// cached pages used without fentry.
    pub fn has_use_tracepoints(&self) -> bool {
        self.use_tracepoints.iter().all(|&t| t)
    }

    /// Whether program `name` of record.bpf.c or waits.bpf.c is the variant
    /// for this kernel (`fentry`: whether fentry programs may be tried).
    /// Programs without variants are always wanted.
    pub fn wants(&self, name: &str, fentry: bool) -> bool {
        let [get_tp, map_tp, fault_tp] = self.use_tracepoints;
        // Functions asked only where fentry may stand in (no BTF parse on
        // a kernel with the tracepoints).
        let f = || self.use_functions();
        match name {
            "handle_exit" | "wt_exit" => self.exit_group_dead,
            "handle_exit_task" | "wt_exit_task" => !self.exit_group_dead,
            "wt_switch" => self.switch_prev_state(),
            "wt_switch_old" => !self.switch_prev_state(),
            "handle_exec" | "sys_enter" | "sys_exit" => self.bpf_loop,
            "handle_exec_bounded" | "sys_enter_bounded" | "sys_exit_bounded" => !self.bpf_loop,
            "use_read" => fentry && !get_tp && f().filemap_read,
            "use_read_old" => {
                fentry && !get_tp && !f().filemap_read && f().generic_file_buffered_read
            }
            "use_map" => fentry && !map_tp && f().filemap_map_pages,
            "use_fault" => fentry && !fault_tp && f().filemap_fault,
            _ => true,
        }
    }

    /// One line for messages and `status`: the release and what it lacks.
    pub fn describe(&self) -> String {
        let mut lacks = Vec::new();
        if !self.btf {
            lacks.push("BTF (/sys/kernel/btf/vmlinux)");
        }
        if self.btf && !self.has_use_tracepoints() {
            lacks.push("page-use tracepoints (6.12)");
        }
        if self.btf && !self.bpf_loop {
            lacks.push("bpf_loop (5.17)");
        }
        if lacks.is_empty() {
            format!("kernel {}", self.release)
        } else {
            format!("kernel {} (without {})", self.release, lacks.join(", "))
        }
    }
}

/// How many arguments tracepoint `tp` passes a tp_btf program: the
/// parameters of its `btf_trace_<tp>` typedef's prototype, less the
/// leading `void *__data`.
fn tracepoint_args(btf: &Btf<'_>, tp: &str) -> Option<usize> {
    let td = btf.type_by_name::<Typedef>(&format!("btf_trace_{tp}"))?;
    let ptr = Ptr::try_from(td.referenced_type()).ok()?;
    let proto = FuncProto::try_from(ptr.referenced_type().skip_mods_and_typedefs()).ok()?;
    Some(proto.len().saturating_sub(1))
}

/// Whether the kernel lets a tracepoint program call `helper`: libbpf
/// loads a two-instruction program that calls it (well under a ms).
fn helper_exists(helper: libbpf_rs::libbpf_sys::bpf_func_id) -> bool {
    libbpf_rs::ProgramType::Tracepoint
        .is_helper_supported(helper)
        .unwrap_or(false)
}

fn nix_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "(unknown)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(new: bool, functions: UseFunctions) -> Kernel {
        Kernel {
            release: "test".into(),
            btf: true,
            exit_group_dead: new,
            bpf_loop: new,
            use_tracepoints: [new; 3],
            deep: Some(Deep {
                exit_group_dead: new,
                switch_prev_state: new,
                use_functions: functions,
                tracepoints: Default::default(),
            }),
        }
    }

    fn since_5_12() -> UseFunctions {
        UseFunctions {
            filemap_read: true,
            generic_file_buffered_read: false,
            filemap_map_pages: true,
            filemap_fault: true,
        }
    }

    #[test]
    fn each_kernel_takes_one_variant_of_each_program() {
        for new in [true, false] {
            let k = kernel(new, since_5_12());
            for pair in [
                ["handle_exit", "handle_exit_task"],
                ["wt_exit", "wt_exit_task"],
                ["wt_switch", "wt_switch_old"],
                ["sys_enter", "sys_enter_bounded"],
                ["sys_exit", "sys_exit_bounded"],
                ["handle_exec", "handle_exec_bounded"],
            ] {
                assert_ne!(k.wants(pair[0], true), k.wants(pair[1], true), "{pair:?}");
            }
        }
    }

    #[test]
    fn fentry_stands_in_only_where_the_tracepoints_are_missing() {
        let new = kernel(true, since_5_12());
        let old = kernel(false, since_5_12());
        for p in ["use_read", "use_map", "use_fault"] {
            assert!(!new.wants(p, true), "{p} on a kernel with the tracepoints");
            assert!(old.wants(p, true), "{p} on a kernel without them");
            assert!(!old.wants(p, false), "{p} when fentry is refused");
        }
        let k510 = kernel(
            false,
            UseFunctions {
                filemap_read: false,
                generic_file_buffered_read: true,
                ..since_5_12()
            },
        );
        assert!(k510.wants("use_read_old", true) && !k510.wants("use_read", true));
        assert!(!old.wants("use_read_old", true));
    }

    #[test]
    fn the_running_kernel_is_described() {
        let k = Kernel::running();
        assert!(k.describe().starts_with("kernel "));
        if k.btf {
            // Every kernel with BTF has this tracepoint, in one form or the
            // other; the cheap answer (tracefs) agrees with the BTF's.
            let btf = Btf::from_vmlinux().unwrap();
            let args = tracepoint_args(&btf, "sched_process_exit");
            assert!(args.is_some());
            if std::env::var_os("WARMSTART_BPF_COMPAT").is_none() {
                assert_eq!(k.exit_group_dead, args == Some(2));
            }
            assert!(k.use_functions().filemap_fault);
        }
    }
}
