//! Compiles `src/bpf/record.bpf.c` with clang and generates its skeleton,
//! whose `types` module gives Rust the structs of `intf.h` (never hand-copied).
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/record.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("target arch is set by cargo");
    let target = match arch.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        other => other,
    };
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            format!("-D__TARGET_ARCH_{target}"),
            "-Isrc/bpf".to_string(),
            "-Wall".to_string(),
        ])
        .build_and_generate(out.join("record.skel.rs"))
        .expect("compiling record.bpf.c (is clang installed? `make deps`)");
    for f in [
        "src/bpf/record.bpf.c",
        "src/bpf/intf.h",
        "src/bpf/vmlinux.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
}
