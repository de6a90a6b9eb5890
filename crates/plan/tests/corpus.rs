//! The decoder corpus in `tests/corpus/`: valid plans and traces, and
//! hostile files (forged sizes, ranges and counts, lying headers), each
//! with the outcome it must have, listed in `tests/corpus/expected.txt`.
//!
//! `cargo test -p warmstart-plan --test corpus -- --ignored write_corpus`
//! writes the files again from the builders below.
//! `cargo test -p warmstart-plan --release --test corpus -- --ignored fuzz_million`
//! runs a million mutations of them through the decoders
//! (`WARMSTART_FUZZ_RUNS=N` for another count).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use warmstart_plan::container::HEADER_LEN;
use warmstart_plan::limits;
use warmstart_plan::plan::{PlanFile, PLAN_MAJOR};
use warmstart_plan::trace::FileId;
use warmstart_plan::{Entry, FormatError, Plan, Trace};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// Every corpus file and the outcome it must have: `ok`, or words of the
/// error it must be refused with.
fn corpus() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let hostile_file = |size: u64, len: u64| {
        let mut p = sample_plan();
        p.meta.command = vec!["x".into()];
        p.meta.passes.clear();
        p.lookups.clear();
        p.files = vec![PlanFile {
            path: "/x".into(),
            id: FileId {
                dev: 1,
                ino: 1,
                size,
                ..Default::default()
            },
        }];
        p.entries = vec![Entry::Data {
            file: 0,
            offset: 0,
            len,
        }];
        p
    };
    let mut total = hostile_file(1 << 20, 4096);
    total.entries = vec![
        Entry::Meta {
            device: 8,
            offset: 0,
            len: limits::MAX_RANGE,
        };
        2
    ];
    let mut many_files = hostile_file(1, 1);
    many_files.entries.clear();
    many_files.files = (0..=limits::MAX_FILES)
        .map(|_| PlanFile {
            // All alike, so the file deflates to almost nothing: the
            // decoder stops at the count before check() sees duplicates.
            path: String::new(),
            id: FileId::default(),
        })
        .collect();
    let mut huge_trace_file = sample_trace();
    huge_trace_file.files[0].id.size = u64::MAX;
    // A trace payload whose first file claims u64::MAX extents and has
    // none: its path, identity, then the forged count.
    let t = sample_trace();
    let mut forged_extents = postcard::to_stdvec(&t.meta).unwrap();
    varint(&mut forged_extents, 1);
    forged_extents.extend(postcard::to_stdvec(&t.files[0].path).unwrap());
    forged_extents.extend(postcard::to_stdvec(&t.files[0].id).unwrap());
    varint(&mut forged_extents, u64::MAX);
    let mut long_path = sample_plan();
    long_path.files[0].path = "/a".repeat(limits::MAX_PATH_LEN as usize);
    let mut payload_len = sample_plan().to_bytes();
    payload_len[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut trace_payload_len = sample_trace().to_bytes();
    trace_payload_len[16..24].copy_from_slice(&(limits::MAX_TRACE_PAYLOAD + 1).to_le_bytes());
    // A plan payload that says "more entries than exist": the meta, empty
    // tables, then an entry count of u64::MAX and nothing after it.
    let mut forged_count = Vec::new();
    forged_count.extend(postcard::to_stdvec(&sample_plan().meta).unwrap());
    forged_count.extend([0, 0]);
    varint(&mut forged_count, u64::MAX);
    let mut future = sample_plan().to_bytes();
    future[8..10].copy_from_slice(&(PLAN_MAJOR + 1).to_le_bytes());
    vec![
        ("valid.plan", sample_plan().to_bytes(), "ok"),
        ("valid.trace", sample_trace().to_bytes(), "ok"),
        (
            "u64max-file-2pow62-entry.plan",
            hostile_file(u64::MAX, 1 << 62).to_bytes(),
            "too large: /x has 18446744073709551615 file size",
        ),
        (
            "range-past-limit.plan",
            hostile_file(1 << 42, (1 << 40) + 4096).to_bytes(),
            "bytes of one range, more than the limit of 1099511627776",
        ),
        (
            "ranges-summing-past-limit.plan",
            total.to_bytes(),
            "bytes of all ranges",
        ),
        (
            "files-past-limit.plan",
            many_files.to_bytes(),
            "has 262145 files, more than the limit of 262144",
        ),
        (
            "u64max-file.trace",
            huge_trace_file.to_bytes(),
            "file size, more than the limit of 9223372036854775807",
        ),
        (
            "extent-count-u64max.trace",
            trace_file(&forged_extents),
            "do not decode",
        ),
        ("path-too-long.plan", long_path.to_bytes(), "path length"),
        (
            "payload-length-u64max.plan",
            payload_len,
            "its header has 18446744073709551615 payload bytes",
        ),
        (
            "payload-length-past-limit.trace",
            trace_payload_len,
            "more than the limit of 1073741824",
        ),
        (
            "entry-count-u64max.plan",
            plan_file(&forged_count),
            "do not decode",
        ),
        ("future-major.plan", future, "version 3.0 is not supported"),
    ]
}

/// Decodes a corpus file as its extension says.
fn decode(name: &str, bytes: &[u8]) -> Result<(), FormatError> {
    if name.ends_with(".plan") {
        Plan::from_bytes(bytes).map(drop)
    } else {
        Trace::from_bytes(bytes).map(drop)
    }
}

#[test]
#[ignore = "writes tests/corpus; run after changing the builders"]
fn write_corpus() {
    let mut expected = String::from(
        "# file<TAB>outcome: ok, or words of the error it must be refused with.\n\
         # Written by `cargo test -p warmstart-plan --test corpus -- --ignored write_corpus`.\n",
    );
    for (name, bytes, outcome) in corpus() {
        std::fs::write(dir().join(name), bytes).unwrap();
        expected.push_str(&format!("{name}\t{outcome}\n"));
    }
    std::fs::write(dir().join("expected.txt"), expected).unwrap();
}

fn expected() -> Vec<(String, String)> {
    std::fs::read_to_string(dir().join("expected.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (f, o) = l.split_once('\t').expect("file<TAB>outcome");
            (f.to_owned(), o.to_owned())
        })
        .collect()
}

/// Every corpus file has its outcome, and a hostile one is refused at
/// once: within a second (the goal for any hostile plan; a regression
/// such as counting a forged range's chunks one by one takes hours) and
/// within the allocation bound.
#[test]
fn corpus_files_have_their_outcomes() {
    let listed = expected();
    let on_disk: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "expected.txt")
        .collect();
    assert_eq!(listed.len(), on_disk.len(), "{on_disk:?}");
    for (name, outcome) in &listed {
        let bytes = std::fs::read(dir().join(name)).unwrap();
        let start = Instant::now();
        let (got, peak) = peak_alloc(|| decode(name, &bytes));
        let took = start.elapsed();
        match (got, outcome.as_str()) {
            (Ok(()), "ok") => {}
            (Err(e), want) if want != "ok" => {
                let e = e.to_string();
                assert!(e.contains(want), "{name}: {e:?} lacks {want:?}");
                assert!(took < Duration::from_secs(1), "{name} took {took:?}");
            }
            (got, want) => panic!("{name}: {got:?}, expected {want}"),
        }
        assert!(
            peak <= alloc_bound(bytes.len()),
            "{name}: {peak} bytes for {} bytes of input",
            bytes.len()
        );
    }
    // The files hold what the builders make (the corpus is not stale);
    // compared beneath the deflate, whose bytes may change with flate2.
    for (name, bytes, outcome) in corpus() {
        let on_disk = std::fs::read(dir().join(name)).unwrap();
        assert_eq!(on_disk[..12], bytes[..12], "{name}: header");
        assert_eq!(payload(name, &on_disk), payload(name, &bytes), "{name}");
        assert!(listed.iter().any(|(f, o)| f == name && o == outcome));
    }
}

/// Too large for a file in the repository (a trace is not compressed):
/// more extents than allowed, really present, stop the decoder at the
/// limit.
#[test]
fn trace_extents_past_the_limit_stop_the_decoder() {
    let mut t = sample_trace();
    t.files.truncate(1);
    let e = t.files[0].extents[0];
    t.files[0].extents = vec![e; limits::MAX_ENTRIES as usize + 1];
    let bytes = t.to_bytes();
    let (got, peak) = peak_alloc(|| Trace::from_bytes(&bytes));
    let e = got.unwrap_err().to_string();
    assert!(
        e.contains("has 4194305 entries, more than the limit of 4194304"),
        "{e}"
    );
    assert!(peak <= alloc_bound(bytes.len()));
}

/// The raw postcard payload of a corpus file, to mutate beneath the
/// checksum; `None` if it has none (a lying header).
fn payload(name: &str, image: &[u8]) -> Option<Vec<u8>> {
    let body = image.get(HEADER_LEN..)?;
    if name.ends_with(".plan") {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(flate2::read::DeflateDecoder::new(body), 64 << 20),
            &mut raw,
        )
        .ok()?;
        Some(raw)
    } else {
        Some(body.to_vec())
    }
}

/// A million mutated corpus files through every decoder: no panic, every
/// decode within the allocation bound. Prints the count, the time and the
/// outcomes.
#[test]
#[ignore = "long: run in release, `--ignored fuzz_million`"]
fn fuzz_million() {
    // WARMSTART_FUZZ_RUNS shortens (or lengthens) the run.
    let runs: u64 = std::env::var("WARMSTART_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let seeds: Vec<(String, Vec<u8>, Option<Vec<u8>>)> = expected()
        .into_iter()
        .map(|(name, _)| {
            let image = std::fs::read(dir().join(&name)).unwrap();
            let raw = payload(&name, &image);
            (name, image, raw)
        })
        .filter(|(_, image, _)| image.len() < 1 << 16)
        .collect();
    let mut rng = Rng(0x5eed_f00d_fa22);
    let (mut accepted, mut refused, mut panics) = (0u64, 0u64, 0u64);
    let (mut worst_alloc, mut worst_seed, mut slowest) = (0.0f64, "", Duration::ZERO);
    let start = Instant::now();
    for i in 0..runs {
        let (name, image, raw) = &seeds[rng.below(seeds.len())];
        let rounds = 1 + rng.below(4);
        let input = match raw {
            // Beneath the checksum half the time, so mutations reach the
            // payload decoder instead of stopping at the CRC.
            Some(raw) if i % 2 == 0 => {
                let mut p = raw.clone();
                for _ in 0..rounds {
                    mutate(&mut rng, &mut p);
                }
                if name.ends_with(".plan") {
                    plan_file(&p)
                } else {
                    trace_file(&p)
                }
            }
            _ => {
                let mut p = image.clone();
                for _ in 0..rounds {
                    mutate(&mut rng, &mut p);
                }
                p
            }
        };
        let t = Instant::now();
        let outcome = std::panic::catch_unwind(|| peak_alloc(|| decode_all(&input)));
        slowest = slowest.max(t.elapsed());
        match outcome {
            Ok((results, peak)) => {
                let ratio = peak as f64 / alloc_bound(input.len()) as f64;
                if ratio > worst_alloc {
                    (worst_alloc, worst_seed) = (ratio, name.as_str());
                }
                for r in results {
                    if r.is_ok() {
                        accepted += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
            Err(_) => panics += 1,
        }
    }
    let took = start.elapsed();
    println!(
        "fuzz_million: {runs} inputs ({} decodes) in {:.1} s: {accepted} accepted, \
         {refused} refused, {panics} panics; slowest input {:?}; \
         largest allocation {:.1}% of its bound (a mutation of {worst_seed})",
        3 * runs,
        took.as_secs_f64(),
        slowest,
        worst_alloc * 100.0
    );
    assert_eq!(panics, 0);
    assert!(worst_alloc <= 1.0);
}
