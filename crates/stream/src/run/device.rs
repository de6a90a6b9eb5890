//! What the device and the machine allow: the device's read throughput,
//! the memory available, and device numbers as the kernel writes them.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// The kernel's dev_t encoding (major << 20 | minor) of a user-space one.
pub(super) fn user_to_kdev(dev: u64) -> u32 {
    ((libc::major(dev) << 20) | libc::minor(dev)) as u32
}

pub(super) fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| warmstart_replay::parse_meminfo(&t).ok())
        .map_or(u64::MAX, |m| m.available)
}

/// Raw read throughput of the device under `sample`: 16 MiB of O_DIRECT
/// reads (prefetchd reads a large uncached file for this).
pub fn measure_throughput(sample: &Path) -> u64 {
    const FALLBACK: u64 = 200 << 20;
    // A path from /proc: a regular file only (see `open`).
    let Ok(f) = warmstart_sys::OpenOptions::file()
        .custom_flags(libc::O_DIRECT)
        .open(sample)
        .map(|o| o.file)
    else {
        return FALLBACK;
    };
    let chunk = 1usize << 20;
    let mut buf = vec![0u8; chunk + 4096];
    let pad = buf.as_ptr().align_offset(4096);
    let t = Instant::now();
    let mut read = 0u64;
    for i in 0..16u64 {
        // SAFETY: the aligned window [pad, pad+chunk) is inside buf.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.as_mut_ptr().add(pad).cast(),
                chunk,
                (i * chunk as u64) as i64,
            )
        };
        if n <= 0 {
            break;
        }
        read += n as u64;
    }
    let secs = t.elapsed().as_secs_f64();
    if read < (4 << 20) || secs <= 0.0 {
        return FALLBACK;
    }
    (read as f64 / secs) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_record::resolve::kdev_to_user;

    #[test]
    fn kernel_and_user_device_numbers_round_trip() {
        for (major, minor) in [(8u32, 1u32), (254, 0), (7, 3), (259, 65_537)] {
            let user = libc::makedev(major, minor);
            assert_eq!(kdev_to_user(user_to_kdev(user) as u64), user);
        }
    }
}
