//! Property tests of the trace and plan decoders against hostile input:
//! whatever the bytes, decoding returns a value that passes `check()` or
//! an error; it never panics, and never allocates more than a bound linear
//! in the input's size, so a forged count or length cannot exhaust memory.

mod common;

use common::*;
use proptest::prelude::*;
use warmstart_plan::container::{Header, HEADER_LEN};
use warmstart_plan::{Plan, Trace};

/// Decodes every way and checks the allocation bound.
fn attack(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (_, peak) = peak_alloc(|| decode_all(bytes));
    prop_assert!(
        peak <= alloc_bound(bytes.len()),
        "{} bytes of input allocated {peak} bytes",
        bytes.len()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        attack(&bytes)?;
    }

    /// Arbitrary payloads in a valid envelope: past the magic, length and
    /// checksum, straight into the payload decoder and `check()`.
    #[test]
    fn arbitrary_payloads(raw in proptest::collection::vec(any::<u8>(), 0..1024)) {
        attack(&plan_file(&raw))?;
        attack(&trace_file(&raw))?;
    }

    /// Valid files, then mutated: the raw payload re-wrapped with a good
    /// checksum (so the mutation reaches the decoder), or the file image
    /// itself (header, checksum and length fields included).
    #[test]
    fn mutated_valid_files(seed in any::<u64>(), rounds in 1usize..6) {
        let mut rng = Rng(seed);
        let plan_raw = postcard_of_plan();
        let trace_raw = postcard_of_trace();
        for (raw, wrap) in [
            (plan_raw, plan_file as fn(&[u8]) -> Vec<u8>),
            (trace_raw, trace_file as fn(&[u8]) -> Vec<u8>),
        ] {
            let mut payload = raw.clone();
            for _ in 0..rounds {
                mutate(&mut rng, &mut payload);
            }
            attack(&wrap(&payload))?;
            let mut image = wrap(&raw);
            for _ in 0..rounds {
                mutate(&mut rng, &mut image);
            }
            attack(&image)?;
        }
    }

    /// The header's length field set to anything: never trusted for an
    /// allocation, and refused from the header alone when over the limit.
    #[test]
    fn length_fields(len in prop_oneof![any::<u64>(), proptest::sample::select(NASTY.to_vec())]) {
        for mut image in [sample_plan().to_bytes(), sample_trace().to_bytes()] {
            image[16..24].copy_from_slice(&len.to_le_bytes());
            attack(&image)?;
            let header = Header::parse(&image[..HEADER_LEN]);
            if len > header.as_ref().map_or(0, |h| h.kind.max_payload()) {
                prop_assert!(header.is_err());
            }
        }
    }
}

fn postcard_of_plan() -> Vec<u8> {
    // The envelope is 24 bytes; its payload is the deflated postcard.
    let image = sample_plan().to_bytes();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::DeflateDecoder::new(&image[HEADER_LEN..]),
        &mut raw,
    )
    .unwrap();
    raw
}

fn postcard_of_trace() -> Vec<u8> {
    sample_trace().to_bytes()[HEADER_LEN..].to_vec()
}

#[test]
fn samples_round_trip() {
    let p = sample_plan();
    assert_eq!(Plan::from_bytes(&p.to_bytes()).unwrap(), p);
    assert_eq!(
        Plan::from_bytes(&plan_file(&postcard_of_plan())).unwrap(),
        p
    );
    let t = sample_trace();
    assert_eq!(Trace::from_bytes(&t.to_bytes()).unwrap(), t);
    assert_eq!(
        Trace::from_bytes(&trace_file(&postcard_of_trace())).unwrap(),
        t
    );
}

/// Forged counts of every table, in a payload otherwise valid: each is
/// refused, and what the decoder allocates stays within the bound.
#[test]
fn forged_counts() {
    let raw = postcard_of_plan();
    for at in 0..raw.len() {
        for &v in &NASTY {
            let mut forged = raw[..at].to_vec();
            varint(&mut forged, v);
            forged.extend_from_slice(&raw[at..]);
            attack(&plan_file(&forged)).unwrap();
        }
    }
}

/// The measurement itself: a bound that nothing could break proves
/// nothing.
#[test]
fn the_allocation_count_sees_allocations() {
    let (v, peak) = peak_alloc(|| vec![1u8; 10 << 20]);
    assert!(peak >= 10 << 20, "{peak}");
    drop(v);
    let (_, peak) = peak_alloc(|| ());
    assert_eq!(peak, 0);
}
