//! Compiles `src/bpf/record.bpf.c` and `src/bpf/waits.bpf.c` with clang and
//! generates their skeletons, whose `types` modules give Rust the structs of
//! `intf.h` and `waits.h` (never hand-copied).
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("target arch is set by cargo");
    // One vmlinux.h, x86_64's, is committed, and .cargo/config.toml names
    // x86_64's library directory: another architecture needs its own of
    // both (libbpf-tools keeps one vmlinux.h per architecture).
    if arch != "x86_64" {
        panic!(
            "warmstart's BPF programs build for x86_64 only (target arch: {arch}): \
             src/bpf/vmlinux.h is x86_64's; add a vmlinux.h for {arch} to build there"
        );
    }
    let target = "x86";
    for name in ["record", "waits"] {
        SkeletonBuilder::new()
            .source(format!("src/bpf/{name}.bpf.c"))
            .clang_args([
                format!("-D__TARGET_ARCH_{target}"),
                "-Isrc/bpf".to_string(),
                "-Wall".to_string(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| {
                panic!("compiling {name}.bpf.c (is clang installed? `make deps`): {e}")
            });
    }
    for f in [
        "src/bpf/record.bpf.c",
        "src/bpf/path.bpf.h",
        "src/bpf/compat.bpf.h",
        "src/bpf/intf.h",
        "src/bpf/waits.bpf.c",
        "src/bpf/waits.h",
        "src/bpf/vmlinux.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
}
