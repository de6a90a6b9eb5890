//! Naming a sleep's kernel stack with `/proc/kallsyms`, to tell a wait
//! for a page (the folio lock, a buffer head) from one for a lock or the
//! journal. Parsing is separate from reading so it is tested on text.

/// Text symbols of the running kernel, sorted by address.
#[derive(Debug, Default)]
pub struct Kallsyms {
    syms: Vec<(u64, String)>,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`; `None` when its addresses are hidden
    /// (kptr_restrict, or not root).
    pub fn load() -> Option<Kallsyms> {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let k = Kallsyms::parse(&text);
        (!k.syms.is_empty()).then_some(k)
    }

    /// `ADDR TYPE NAME [MODULE]` lines; only text (t/T) symbols at
    /// non-zero addresses are kept.
    pub fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort_unstable();
        Kallsyms { syms }
    }

    /// The function containing `addr`; `None` below the first symbol and
    /// past the end of the kernel's text (up to the next symbol): a BPF
    /// program's JIT code, for one, has no symbol once it is unloaded, and
    /// naming it after the marker before it (`_einittext`) would pass it
    /// off as the function a thread slept in.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        let name = self.syms[i.checked_sub(1)?].1.as_str();
        (!TEXT_ENDS.contains(&name)).then_some(name)
    }
}

/// Markers where the kernel's text ends: what follows them, up to the
/// next symbol, is no function.
const TEXT_ENDS: [&str; 2] = ["_etext", "_einittext"];

/// What a D-state sleep was for, from its kernel stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SleepWhy {
    /// Waiting for storage: a page or buffer being read, or the block
    /// layer taking a read.
    pub for_page: bool,
    /// The innermost frame below the scheduler, for reports.
    pub function: String,
}

/// Frames of a wait for storage. `io_schedule` is how the kernel itself
/// marks a sleep as I/O wait (the folio lock, buffer heads, synchronous
/// bios, the block layer's tags all sleep through it); the others are the
/// page and buffer waits by name, for kernels that inline it away.
const PAGE_WAITS: [&str; 7] = [
    "io_schedule",
    "folio_wait",
    "folio_lock",
    "folio_put_wait_locked",
    "wait_on_page",
    "__wait_on_buffer",
    "bh_read",
];

/// Frames that say only that the thread slept (the scheduler, the
/// tracer's own).
fn is_plumbing(name: &str) -> bool {
    name.contains("schedule")
        || name.contains("bpf")
        || name.starts_with("__traceiter")
        || name.contains("bit_wait")
        || name.starts_with("__wait_on_bit")
        || name.starts_with("out_of_line_wait")
}

/// Classifies a stack given innermost first.
pub fn sleep_why<'a>(frames: impl IntoIterator<Item = &'a str>) -> SleepWhy {
    let mut function = None;
    let mut for_page = false;
    for name in frames {
        if function.is_none() && !is_plumbing(name) {
            function = Some(name.to_string());
        }
        for_page |= PAGE_WAITS.iter().any(|p| name.contains(p));
    }
    SleepWhy {
        for_page,
        function: function.unwrap_or_else(|| "?".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
0000000000000000 A fixed_percpu_data
ffffffff81000000 T _stext
ffffffff81100000 T folio_wait_bit_common
ffffffff81100400 t filemap_update_page
ffffffff81200000 T rwsem_down_read_slowpath
ffffffff81300000 D some_data
ffffffff81400000 T __schedule
ffffffff81400800 T schedule
ffffffff81500000 T ext4_init [ext4]
ffffffff81600000 T _einittext
ffffffffc0201000 t ftrace_trampoline [__builtin__ftrace]
";

    #[test]
    fn addresses_name_the_function_that_contains_them() {
        let k = Kallsyms::parse(TEXT);
        assert_eq!(k.name(0xffffffff81100010), Some("folio_wait_bit_common"));
        assert_eq!(k.name(0xffffffff81100400), Some("filemap_update_page"));
        assert_eq!(
            k.name(0xffffffff81300010),
            Some("rwsem_down_read_slowpath"),
            "data is skipped"
        );
        assert_eq!(k.name(0xffffffff81500001), Some("ext4_init"));
        assert_eq!(k.name(0x1000), None);
        assert_eq!(
            k.name(0xffffffffa0001234),
            None,
            "past the end of the text: an unloaded BPF program"
        );
        assert_eq!(k.name(0xffffffffc0201010), Some("ftrace_trampoline"));
    }

    #[test]
    fn an_unnamed_frame_leaves_the_function_to_the_next() {
        let k = Kallsyms::parse(TEXT);
        let stack = [0xffffffffa0001234, 0xffffffff81400010, 0xffffffff81200010];
        let w = sleep_why(stack.iter().filter_map(|&a| k.name(a)));
        assert_eq!(w.function, "rwsem_down_read_slowpath");
        assert!(!w.for_page);
    }

    #[test]
    fn a_stack_through_the_folio_lock_is_a_page_wait() {
        let w = sleep_why([
            "bpf_prog_1_wt_switch",
            "__schedule",
            "schedule",
            "io_schedule",
            "folio_wait_bit_common",
            "filemap_fault",
        ]);
        assert!(w.for_page);
        assert_eq!(w.function, "folio_wait_bit_common");
        let w = sleep_why([
            "__schedule",
            "schedule",
            "rwsem_down_read_slowpath",
            "lock_mm_and_find_vma",
        ]);
        assert!(!w.for_page);
        assert_eq!(w.function, "rwsem_down_read_slowpath");
        let w = sleep_why([
            "__schedule",
            "io_schedule",
            "bit_wait_io",
            "__wait_on_bit",
            "out_of_line_wait_on_bit",
            "__wait_on_buffer",
            "ext4_read_bh",
        ]);
        assert!(w.for_page, "a metadata read through a buffer head");
        assert_eq!(w.function, "__wait_on_buffer");
        let w = sleep_why([
            "__schedule",
            "schedule",
            "io_schedule",
            "ext4_read_bh",
            "__ext4_get_inode_loc",
        ]);
        assert!(w.for_page, "an I/O wait, whatever calls it");
        assert_eq!(w.function, "ext4_read_bh");
        let w = sleep_why([
            "__schedule",
            "schedule",
            "d_alloc_parallel",
            "__lookup_slow",
        ]);
        assert!(!w.for_page, "another thread's lookup");
    }
}
