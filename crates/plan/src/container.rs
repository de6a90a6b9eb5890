//! The on-disk envelope shared by trace and plan files: a magic that names
//! the kind of file, a major/minor version, a CRC-32 of the payload and its
//! length, then the payload serialized with postcard (compact, maintained,
//! serde-based). Plans store that payload deflated: they are read before
//! every prefetched launch, and most of their bytes are file paths that
//! share long prefixes. Readers refuse anything they cannot fully vouch for.

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::limits::{Budget, Limit, MAX_PLAN_PAYLOAD, MAX_TRACE_PAYLOAD};

/// Header size: magic (8) + major (2) + minor (2) + crc32 (4) + length (8).
pub const HEADER_LEN: usize = 24;

/// Whether `head` (a file's first 8 bytes) is the magic of a trace or plan.
pub fn is_magic(head: &[u8]) -> bool {
    Kind::from_magic(head).is_some()
}

/// What a file claims to be, by its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Trace,
    Plan,
}

impl Kind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Kind::Trace => b"WSTRACE\0",
            Kind::Plan => b"WSPLAN\0\0",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Trace => "trace",
            Kind::Plan => "plan",
        }
    }

    /// The major format version this build reads.
    pub fn major(self) -> u16 {
        match self {
            Kind::Trace => crate::trace::TRACE_MAJOR,
            Kind::Plan => crate::plan::PLAN_MAJOR,
        }
    }

    /// The largest payload a header of this kind may promise.
    pub fn max_payload(self) -> u64 {
        match self {
            Kind::Trace => MAX_TRACE_PAYLOAD,
            Kind::Plan => MAX_PLAN_PAYLOAD,
        }
    }

    pub fn from_magic(m: &[u8]) -> Option<Kind> {
        [Kind::Trace, Kind::Plan]
            .into_iter()
            .find(|k| k.magic().as_slice() == m)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a trace or plan file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("file is {len} bytes, too short to be a warmstart {expected} (truncated?)")]
    TooShort { expected: Kind, len: usize },
    #[error("not a warmstart {expected}: it is a warmstart {found}")]
    WrongKind { expected: Kind, found: Kind },
    #[error("not a warmstart {expected} file (unknown magic {magic:02x?})")]
    BadMagic { expected: Kind, magic: Vec<u8> },
    #[error("{kind} format version {major}.{minor} is not supported (this warmstart reads {supported}.x); re-create it with this version")]
    UnsupportedVersion {
        kind: Kind,
        major: u16,
        minor: u16,
        supported: u16,
    },
    #[error("{kind} is truncated: header promises {expected} payload bytes, file has {actual}")]
    Truncated {
        kind: Kind,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{kind} is corrupt: {extra} bytes follow the {expected} payload bytes its header promises"
    )]
    TrailingBytes {
        kind: Kind,
        expected: u64,
        extra: u64,
    },
    #[error("{kind} is corrupt: checksum {actual:08x} does not match {expected:08x}")]
    Checksum {
        kind: Kind,
        expected: u32,
        actual: u32,
    },
    #[error("{kind} is corrupt: its contents do not decode: {source}")]
    Decode {
        kind: Kind,
        #[source]
        source: postcard::Error,
    },
    #[error("{kind} is inconsistent: {what}")]
    Invalid { kind: Kind, what: String },
    /// A value past one of the [`crate::limits`]; `at` says where.
    #[error("{kind} is too large: {at} has {value} {limit}, more than the limit of {max}")]
    TooLarge {
        kind: Kind,
        limit: Limit,
        value: u64,
        max: u64,
        at: String,
    },
    #[error("file is {len} bytes, too short to be a warmstart trace or plan (truncated?)")]
    TooShortForAny { len: usize },
    #[error("not a warmstart trace or plan (unknown magic {magic:02x?})")]
    Foreign { magic: Vec<u8> },
    #[error("reading the {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl FormatError {
    /// The error for `value` past `limit` (whose maximum is `limit.max()`).
    pub(crate) fn too_large(kind: Kind, (limit, value): (Limit, u64), at: String) -> FormatError {
        FormatError::TooLarge {
            kind,
            limit,
            value,
            max: limit.max(),
            at,
        }
    }
}

/// A file's header: what the first [`HEADER_LEN`] bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub major: u16,
    pub minor: u16,
    pub crc: u32,
    /// Payload bytes that follow the header.
    pub len: u64,
}

impl Header {
    /// Parses and checks the first [`HEADER_LEN`] bytes of a file: a
    /// warmstart magic, a major version this build reads, and a payload
    /// length within its kind's limit. Looks at nothing past the header,
    /// so a foreign, future or oversized file is refused before its body
    /// is read.
    pub fn parse(bytes: &[u8]) -> Result<Header, FormatError> {
        if bytes.len() < 8 {
            return Err(FormatError::TooShortForAny { len: bytes.len() });
        }
        let Some(kind) = Kind::from_magic(&bytes[..8]) else {
            return Err(FormatError::Foreign {
                magic: bytes[..bytes.len().min(8)].to_vec(),
            });
        };
        if bytes.len() < HEADER_LEN {
            return Err(FormatError::TooShort {
                expected: kind,
                len: bytes.len(),
            });
        }
        let major = u16::from_le_bytes([bytes[8], bytes[9]]);
        let minor = u16::from_le_bytes([bytes[10], bytes[11]]);
        if major != kind.major() {
            return Err(FormatError::UnsupportedVersion {
                kind,
                major,
                minor,
                supported: kind.major(),
            });
        }
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        if len > kind.max_payload() {
            return Err(FormatError::TooLarge {
                kind,
                limit: Limit::Payload,
                value: len,
                max: kind.max_payload(),
                at: "its header".into(),
            });
        }
        Ok(Header {
            kind,
            major,
            minor,
            crc,
            len,
        })
    }

    /// Reads and checks the header from the start of `r`, reading exactly
    /// [`HEADER_LEN`] bytes (fewer if the input ends first).
    pub fn read(r: &mut impl Read) -> Result<Header, FormatError> {
        let mut head = Vec::with_capacity(HEADER_LEN);
        r.take(HEADER_LEN as u64)
            .read_to_end(&mut head)
            .map_err(|source| FormatError::Io {
                what: "header",
                source,
            })?;
        Header::parse(&head)
    }
}

/// Reads a whole trace or plan file from `r`: the header first, checked
/// by [`Header::read`], then the payload it promises and not a byte more
/// than that plus one (to tell a longer file). Returns the header and the
/// complete file image for [`crate::Plan::from_bytes`] or
/// [`crate::Trace::from_bytes`], which check the rest.
pub fn read(r: &mut impl Read) -> Result<(Header, Vec<u8>), FormatError> {
    let header = Header::read(r)?;
    let mut bytes = Vec::with_capacity(HEADER_LEN + header.len.min(1 << 20) as usize);
    bytes.extend_from_slice(&envelope_header(header));
    r.take(header.len + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| FormatError::Io {
            what: "payload",
            source,
        })?;
    Ok((header, bytes))
}

fn envelope_header(h: Header) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..8].copy_from_slice(h.kind.magic());
    out[8..10].copy_from_slice(&h.major.to_le_bytes());
    out[10..12].copy_from_slice(&h.minor.to_le_bytes());
    out[12..16].copy_from_slice(&h.crc.to_le_bytes());
    out[16..24].copy_from_slice(&h.len.to_le_bytes());
    out
}

/// The most a deflated payload may inflate to: far above any real plan,
/// low enough that a hostile file cannot exhaust memory.
pub const MAX_INFLATED: u64 = 256 << 20;

/// Serializes `value` into a complete file image.
pub fn encode<T: Serialize>(kind: Kind, major: u16, minor: u16, value: &T) -> Vec<u8> {
    let payload = postcard::to_stdvec(value).expect("serializing to memory cannot fail");
    envelope(kind, major, minor, payload)
}

/// As [`encode`], with the payload deflated.
pub fn encode_deflated<T: Serialize>(kind: Kind, major: u16, minor: u16, value: &T) -> Vec<u8> {
    let raw = postcard::to_stdvec(value).expect("serializing to memory cannot fail");
    envelope(kind, major, minor, deflate(&raw))
}

/// Deflates a raw payload as [`encode_deflated`] does: for tools and tests
/// that build files byte by byte (the fuzz corpus).
pub fn deflate(raw: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(raw).expect("deflating to memory cannot fail");
    z.finish().expect("deflating to memory cannot fail")
}

/// A complete file image around `payload` (already deflated for a plan),
/// with its length and checksum filled in.
pub fn envelope(kind: Kind, major: u16, minor: u16, payload: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(kind.magic());
    out.extend_from_slice(&major.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Checks the envelope and decodes the payload. Files of the same major
/// version and any minor are read (minors only add trailing optional data).
pub fn decode<T: DeserializeOwned>(
    expected: Kind,
    major: u16,
    bytes: &[u8],
) -> Result<T, FormatError> {
    let payload = checked_payload(expected, major, bytes)?;
    bounded_decode(expected, payload)
}

/// Decodes a payload with the element counts of [`crate::limits`] enforced
/// as it goes, so a forged length cannot make it allocate past them.
fn bounded_decode<T: DeserializeOwned>(kind: Kind, payload: &[u8]) -> Result<T, FormatError> {
    let budget = Budget::start();
    postcard::from_bytes(payload).map_err(|source| match budget.exceeded() {
        Some(over) => FormatError::too_large(kind, over, "its contents".into()),
        None => FormatError::Decode { kind, source },
    })
}

/// As [`decode`], for a payload written by [`encode_deflated`].
pub fn decode_deflated<T: DeserializeOwned>(
    expected: Kind,
    major: u16,
    bytes: &[u8],
) -> Result<T, FormatError> {
    let payload = checked_payload(expected, major, bytes)?;
    let mut raw = Vec::new();
    flate2::read::DeflateDecoder::new(payload)
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut raw)
        .map_err(|e| FormatError::Invalid {
            kind: expected,
            what: format!("its payload does not inflate: {e}"),
        })?;
    if raw.len() as u64 > MAX_INFLATED {
        return Err(FormatError::Invalid {
            kind: expected,
            what: format!("its payload inflates past {MAX_INFLATED} bytes"),
        });
    }
    bounded_decode(expected, &raw)
}

/// The envelope's checks; returns the payload they vouch for.
fn checked_payload(expected: Kind, major: u16, bytes: &[u8]) -> Result<&[u8], FormatError> {
    if bytes.len() < HEADER_LEN {
        if bytes.len() >= 8 {
            check_magic(expected, &bytes[..8])?;
        }
        return Err(FormatError::TooShort {
            expected,
            len: bytes.len(),
        });
    }
    check_magic(expected, &bytes[..8])?;
    let file_major = u16::from_le_bytes([bytes[8], bytes[9]]);
    let file_minor = u16::from_le_bytes([bytes[10], bytes[11]]);
    if file_major != major {
        return Err(FormatError::UnsupportedVersion {
            kind: expected,
            major: file_major,
            minor: file_minor,
            supported: major,
        });
    }
    let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if len > expected.max_payload() {
        return Err(FormatError::TooLarge {
            kind: expected,
            limit: Limit::Payload,
            value: len,
            max: expected.max_payload(),
            at: "its header".into(),
        });
    }
    let payload = &bytes[HEADER_LEN..];
    if payload.len() as u64 > len {
        return Err(FormatError::TrailingBytes {
            kind: expected,
            expected: len,
            extra: payload.len() as u64 - len,
        });
    }
    if payload.len() as u64 != len {
        return Err(FormatError::Truncated {
            kind: expected,
            expected: len,
            actual: payload.len() as u64,
        });
    }
    let actual = crc32fast::hash(payload);
    if actual != crc {
        return Err(FormatError::Checksum {
            kind: expected,
            expected: crc,
            actual,
        });
    }
    Ok(payload)
}

fn check_magic(expected: Kind, magic: &[u8]) -> Result<(), FormatError> {
    match Kind::from_magic(magic) {
        Some(k) if k == expected => Ok(()),
        Some(found) => Err(FormatError::WrongKind { expected, found }),
        None => Err(FormatError::BadMagic {
            expected,
            magic: magic.to_vec(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Payload {
        a: u64,
        b: Vec<String>,
    }

    fn sample() -> Vec<u8> {
        encode(
            Kind::Trace,
            1,
            0,
            &Payload {
                a: 7,
                b: vec!["x".into()],
            },
        )
    }

    #[test]
    fn round_trip() {
        let p: Payload = decode(Kind::Trace, 1, &sample()).unwrap();
        assert_eq!(p.a, 7);
    }

    #[test]
    fn deflated_round_trip_and_garbage() {
        let value = Payload {
            a: 9,
            b: (0..200)
                .map(|i| format!("/usr/lib/python3.11/encodings/m{i}.pyc"))
                .collect(),
        };
        let plain = encode(Kind::Plan, 2, 0, &value);
        let small = encode_deflated(Kind::Plan, 2, 0, &value);
        assert!(
            small.len() * 3 < plain.len(),
            "{} vs {}",
            small.len(),
            plain.len()
        );
        let back: Payload = decode_deflated(Kind::Plan, 2, &small).unwrap();
        assert_eq!(back, value);
        // A valid envelope around bytes that are not deflate data.
        let err = decode_deflated::<Payload>(Kind::Plan, 2, &plain)
            .unwrap_err()
            .to_string();
        assert!(err.contains("corrupt") || err.contains("inflate"), "{err}");
    }

    #[test]
    fn two_files_in_one_are_not_called_truncated() {
        let mut twice = sample();
        twice.extend(sample());
        let err = decode::<Payload>(Kind::Trace, 1, &twice)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bytes follow"), "{err}");
    }

    #[test]
    fn rejections() {
        let good = sample();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 0xff;
        let mut future = good.clone();
        future[8] = 9;
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", vec![], "too short"),
            ("truncated header", good[..10].to_vec(), "too short"),
            (
                "truncated payload",
                good[..good.len() - 1].to_vec(),
                "truncated",
            ),
            ("bit flip", flipped, "checksum"),
            (
                "foreign",
                b"\x7fELF\x02\x01\x01\0aaaaaaaaaaaaaaaaaaaaaaaa".to_vec(),
                "unknown magic",
            ),
            ("future major", future, "version 9.0 is not supported"),
        ];
        for (name, bytes, want) in cases {
            let err = decode::<Payload>(Kind::Trace, 1, &bytes)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{name}: {err:?} lacks {want:?}");
        }
        let err = decode::<Payload>(Kind::Plan, 1, &good)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not a warmstart plan: it is a warmstart trace"),
            "{err}"
        );
    }

    /// A reader that fails the test if read past `allowed` bytes.
    struct Guarded<'a> {
        bytes: &'a [u8],
        pos: usize,
        allowed: usize,
    }

    impl Read for Guarded<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.bytes.len() - self.pos);
            assert!(
                self.pos + n <= self.allowed,
                "read up to byte {} of {}",
                self.pos + n,
                self.allowed
            );
            buf[..n].copy_from_slice(&self.bytes[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn headers_are_checked_before_the_body_is_read() {
        let plan = encode_deflated(Kind::Plan, crate::plan::PLAN_MAJOR, 0, &7u64);
        let mut huge = plan.clone();
        huge[16..24].copy_from_slice(&(MAX_PLAN_PAYLOAD + 1).to_le_bytes());
        let mut future = plan.clone();
        future[8] = 9;
        let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
        elf.resize(1 << 20, 0);
        // (name, file, what the header says)
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("a foreign file", elf, "unknown magic"),
            (
                "an oversized payload",
                huge,
                "more than the limit of 67108864",
            ),
            ("a future version", future, "version 9.0"),
            ("a short file", plan[..12].to_vec(), "too short"),
        ];
        for (name, bytes, want) in cases {
            let mut r = Guarded {
                bytes: &bytes,
                pos: 0,
                allowed: HEADER_LEN,
            };
            let err = read(&mut r).unwrap_err().to_string();
            assert!(err.contains(want), "{name}: {err}");
        }
        // A good file: the header, then exactly the promised payload.
        let mut with_tail = plan.clone();
        with_tail.extend_from_slice(&[0; 4096]);
        let mut r = Guarded {
            bytes: &with_tail,
            pos: 0,
            allowed: plan.len() + 1,
        };
        let (h, bytes) = read(&mut r).unwrap();
        assert_eq!(
            (h.kind, h.len as usize),
            (Kind::Plan, plan.len() - HEADER_LEN)
        );
        assert_eq!(&bytes[..plan.len()], &plan[..]);
        assert_eq!(decode_deflated::<u64>(Kind::Plan, 2, &plan).unwrap(), 7);
    }
}
