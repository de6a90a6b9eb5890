//! Slow-storage profiles: a device model per kind of storage, and the clock
//! that turns a request into the instant it completes.
//!
//! A model has these figures:
//! - `latency`: fixed cost of every request (command, flash read, network
//!   round trip), paid before its data moves;
//! - `bandwidth`: bytes per second the device moves, shared by all requests
//!   (one transfer at a time, back to back);
//! - `queue_depth`: requests the device works on at once; more wait for a
//!   slot (the FUSE server runs exactly this many workers);
//! - `iops`: requests the device starts per second, if capped, with requests
//!   larger than `io_unit` counted as several;
//! - `seek`, for a disk with a head: a request a little ahead of where the
//!   previous one ended waits for the platter to bring it under the head
//!   (the gap at the media rate); one anywhere else pays for positioning,
//!   a fixed part (the head settling, half a rotation) and a part that
//!   grows with the square root of the distance (the arm accelerates,
//!   then coasts);
//! - `merge`, for a device the host keeps a scheduler queue for: requests
//!   waiting for the device that touch one another are served as one, up
//!   to this many bytes (mq-deadline's back and front merges).
//!
//! A request that gets a slot at `t` starts at `max(t, next IOPS token)`,
//! moves its data from `max(start + latency, end of the previous transfer)`
//! for `bytes / bandwidth`, and completes when that transfer ends. So at
//! queue depth 1 a 4 KiB read costs `latency + 4 KiB / bandwidth`, and with
//! enough requests in flight sequential reads reach `bandwidth`.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A named slow-storage profile (`--storage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// SD card or eMMC on a small board.
    Sd,
    /// A cloud provider's network block device.
    Cloud,
    /// A SATA solid-state drive.
    SataSsd,
    /// A 7200 rpm hard disk.
    Hdd,
}

impl Profile {
    /// Every profile, in the order the bench runs them.
    pub const ALL: [Profile; 4] = [Profile::Sd, Profile::Cloud, Profile::SataSsd, Profile::Hdd];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Sd => "sd",
            Profile::Cloud => "cloud",
            Profile::SataSsd => "sata-ssd",
            Profile::Hdd => "hdd",
        }
    }

    /// The device model of this profile.
    pub fn model(self) -> DeviceModel {
        match self {
            // SD card in a UHS-I DDR50 slot (a Raspberry Pi's): the bus moves
            // at most 50 MB/s, cards read ~40 MB/s sequentially in it. The SD
            // Association's Application Performance Class A1 guarantees 1500
            // random 4 KiB read IOPS (A2: 4000, but only with command
            // queueing, which most hosts do not enable), and measured cards
            // on a Pi read 4 KiB at random at 5-8 MB/s, i.e. 1300-2000 IOPS
            // (pidramble.com/wiki/benchmarks/microsd-cards). 0.6 ms + 4 KiB
            // at 40 MB/s = 0.7 ms per request = ~1400 IOPS at queue depth 1.
            // Without command queueing the card serves one request at a time.
            // The host keeps the rest in its scheduler (mq-deadline, as for
            // any single-queue device), which merges the ones that touch
            // into one multi-block read of at most 512 KiB (sdhci's
            // max_req_size, the SDMA boundary).
            Profile::Sd => DeviceModel {
                latency: Duration::from_micros(600),
                bandwidth: 40_000_000,
                queue_depth: 1,
                iops: None,
                io_unit: 0,
                seek: None,
                merge: 512 * 1024,
            },
            // AWS EBS gp3 at its baseline (the default volume type): 3000
            // IOPS and 125 MiB/s whatever the size (EC2 API reference,
            // CreateVolume Iops/Throughput), "single-digit millisecond"
            // latency, typically ~1 ms for a 4 KiB read across the network;
            // EBS counts SSD-volume I/O in units of up to 256 KiB. A guest
            // keeps up to 32 requests in flight on such a volume (NVMe/virtio
            // queue; the AWS guidance for gp3 is a queue length of ~4 per
            // 1000 IOPS, far below 32 at 3000 IOPS). NVMe queues have no
            // scheduler (`none`), so nothing waits to be merged.
            Profile::Cloud => DeviceModel {
                latency: Duration::from_micros(1000),
                bandwidth: 125 * 1024 * 1024,
                queue_depth: 32,
                iops: Some(3000),
                io_unit: 256 * 1024,
                seek: None,
                merge: 0,
            },
            // Samsung 870 EVO, a mainstream TLC SATA SSD: 560 MB/s sequential
            // read and 98,000 random read IOPS at QD32 (vendor spec, quoted
            // in cdrlabs.com's review); 4 KiB random reads at QD1 measure
            // 39-47 MB/s in CrystalDiskMark (PCWorld, March 2021), i.e.
            // ~90 us each. SATA NCQ holds 32 commands; beyond them requests
            // wait in mq-deadline and merge, up to the block layer's default
            // 1280 KiB per request.
            Profile::SataSsd => DeviceModel {
                latency: Duration::from_micros(80),
                bandwidth: 560_000_000,
                queue_depth: 32,
                iops: Some(98_000),
                io_unit: 0,
                seek: None,
                merge: 1280 * 1024,
            },
            // A 7200 rpm desktop disk (Seagate BarraCuda, WD Blue): 8.5 ms
            // average seek, 4.16 ms average rotational latency (half a
            // turn), about 1 ms track to track, 160-200 MB/s sequential on
            // the outer tracks (vendor data sheets). Here a request away
            // from the head costs 1 ms + 4.16 ms + up to 15 ms across the
            // image, so random 4 KiB reads over it take about 13 ms, the
            // figure such disks measure at queue depth 1 (75-80 IOPS).
            // Command queueing (NCQ) is not modelled: one request at a
            // time, the rest kept, sorted and merged (up to 1280 KiB) by the
            // host's mq-deadline.
            Profile::Hdd => DeviceModel {
                latency: Duration::from_micros(100),
                bandwidth: 160_000_000,
                queue_depth: 1,
                iops: None,
                io_unit: 0,
                seek: Some(Seek {
                    min: Duration::from_micros(5_160),
                    full_stroke: Duration::from_millis(15),
                    // One turn (8.33 ms) at 160 MB/s.
                    track: 1_333_000,
                }),
                merge: 1280 * 1024,
            },
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| crate::Error::UnknownProfile(s.to_string()))
    }
}

/// The figures of a simulated device; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceModel {
    /// Fixed cost of each request, before its data moves.
    pub latency: Duration,
    /// Bytes per second, shared by all requests.
    pub bandwidth: u64,
    /// Requests served at once; more wait.
    pub queue_depth: u32,
    /// Requests started per second, if capped.
    pub iops: Option<u32>,
    /// A request larger than this counts as several against `iops` (0: any
    /// request counts as one).
    pub io_unit: u64,
    /// Positioning, for a disk with a head; `None`: any order costs the same.
    #[serde(default)]
    pub seek: Option<Seek>,
    /// Largest request the host's scheduler makes by merging requests that
    /// wait for the device and touch one another; 0: no scheduler queue.
    #[serde(default)]
    pub merge: u64,
}

/// The positioning cost of a disk with a head; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seek {
    /// Paid by every request that does not start where the previous ended.
    pub min: Duration,
    /// Added for a seek across the whole device; a seek over a share `x`
    /// of it adds `sqrt(x)` of this.
    pub full_stroke: Duration,
    /// Bytes under the head in one turn: a request less than this far
    /// ahead of the head costs the gap at the model's bandwidth instead.
    pub track: u64,
}

impl DeviceModel {
    /// Time to move `bytes` at the model's bandwidth.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        Duration::from_nanos((bytes as u128 * 1_000_000_000 / self.bandwidth.max(1) as u128) as u64)
    }

    /// How many I/Os a request of `bytes` counts as against the IOPS cap.
    fn ios(&self, bytes: u64) -> u64 {
        if self.io_unit == 0 {
            1
        } else {
            bytes.div_ceil(self.io_unit).max(1)
        }
    }
}

impl fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} us latency, {:.1} MB/s, queue depth {}",
            self.latency.as_micros(),
            self.bandwidth as f64 / 1e6,
            self.queue_depth
        )?;
        if let Some(iops) = self.iops {
            write!(f, ", {iops} IOPS")?;
        }
        if let Some(seek) = self.seek {
            write!(
                f,
                ", seeks {:.1}-{:.1} ms",
                seek.min.as_secs_f64() * 1e3,
                (seek.min + seek.full_stroke).as_secs_f64() * 1e3
            )?;
        }
        if self.merge > 0 {
            write!(f, ", merges up to {} KiB", self.merge >> 10)?;
        }
        Ok(())
    }
}

/// The shared clocks of one simulated device.
#[derive(Debug)]
pub struct DeviceClock {
    model: DeviceModel,
    /// Bytes the device holds: the distance a full stroke crosses.
    size: u64,
    state: Mutex<ClockState>,
}

#[derive(Debug)]
struct ClockState {
    /// When the next request may start under the IOPS cap.
    iops_next: Instant,
    /// When the device finishes the transfers already scheduled.
    transfer_end: Instant,
    /// Where the last scheduled request ended: the head's position.
    head: u64,
}

impl DeviceClock {
    /// A device of `size` bytes that is idle at `now`.
    pub fn new(model: DeviceModel, size: u64, now: Instant) -> Self {
        DeviceClock {
            model,
            size,
            state: Mutex::new(ClockState {
                iops_next: now,
                transfer_end: now,
                head: 0,
            }),
        }
    }

    /// Where the last scheduled request ended, for a device with a head.
    pub fn head(&self) -> Option<u64> {
        self.model.seek?;
        Some(self.state.lock().unwrap_or_else(|e| e.into_inner()).head)
    }

    /// The model this clock runs.
    pub fn model(&self) -> &DeviceModel {
        &self.model
    }

    /// Schedules a request of `bytes` at `offset` that got a queue slot at
    /// `now`; returns when it completes.
    pub fn schedule(&self, now: Instant, offset: u64, bytes: u64) -> Instant {
        let m = &self.model;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut start = now;
        if let Some(iops) = m.iops {
            start = start.max(s.iops_next);
            let spacing = Duration::from_nanos(1_000_000_000 / u64::from(iops.max(1)));
            s.iops_next = start + spacing * m.ios(bytes) as u32;
        }
        let mut transfer_start = (start + m.latency).max(s.transfer_end);
        if let Some(seek) = m.seek {
            let ahead = offset.wrapping_sub(s.head);
            if ahead < seek.track {
                transfer_start += m.transfer_time(ahead);
            } else {
                let share = (offset.abs_diff(s.head) as f64 / self.size.max(1) as f64).min(1.0);
                transfer_start += seek.min + seek.full_stroke.mul_f64(share.sqrt());
            }
        }
        s.head = offset.saturating_add(bytes);
        s.transfer_end = transfer_start + m.transfer_time(bytes);
        s.transfer_end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn model(latency: Duration, bandwidth: u64, iops: Option<u32>) -> DeviceModel {
        DeviceModel {
            latency,
            bandwidth,
            queue_depth: 1,
            iops,
            io_unit: 0,
            seek: None,
            merge: 0,
        }
    }

    #[test]
    fn model_prints_its_figures() {
        assert_eq!(
            Profile::Cloud.model().to_string(),
            "1000 us latency, 131.1 MB/s, queue depth 32, 3000 IOPS"
        );
    }

    #[test]
    fn names_round_trip() {
        for p in Profile::ALL {
            assert_eq!(p.name().parse::<Profile>().unwrap(), p);
        }
        assert!("floppy".parse::<Profile>().is_err());
    }

    #[test]
    fn one_request_costs_latency_plus_transfer() {
        let t0 = Instant::now();
        let c = DeviceClock::new(model(MS, 1_000_000, None), 1 << 30, t0);
        // 1000 bytes at 1 MB/s = 1 ms.
        assert_eq!(c.schedule(t0, 0, 1000), t0 + 2 * MS);
    }

    #[test]
    fn concurrent_requests_share_bandwidth_but_overlap_latency() {
        let t0 = Instant::now();
        let c = DeviceClock::new(model(MS, 1_000_000, None), 1 << 30, t0);
        // Both pay 1 ms latency at once; transfers of 1 ms each follow one
        // another.
        assert_eq!(c.schedule(t0, 0, 1000), t0 + 2 * MS);
        assert_eq!(c.schedule(t0, 0, 1000), t0 + 3 * MS);
        // A request arriving after the device went idle starts afresh.
        let later = t0 + 10 * MS;
        assert_eq!(c.schedule(later, 0, 1000), later + 2 * MS);
    }

    #[test]
    fn iops_cap_spaces_request_starts() {
        let t0 = Instant::now();
        let c = DeviceClock::new(model(Duration::ZERO, u64::MAX / 4, Some(1000)), 1 << 30, t0);
        let done: Vec<_> = (0..3).map(|_| c.schedule(t0, 0, 1)).collect();
        assert!(done[0] - t0 < MS);
        assert!(done[1] - t0 >= MS && done[1] - t0 < 2 * MS);
        assert!(done[2] - t0 >= 2 * MS && done[2] - t0 < 3 * MS);
    }

    #[test]
    fn large_requests_count_as_several_ios() {
        let t0 = Instant::now();
        let mut m = model(Duration::ZERO, u64::MAX / 4, Some(1000));
        m.io_unit = 256 * 1024;
        let c = DeviceClock::new(m, 1 << 30, t0);
        c.schedule(t0, 0, 1024 * 1024); // 4 I/Os: the next starts 4 ms later
        assert!(c.schedule(t0, 0, 4096) - t0 >= 4 * MS);
    }

    #[test]
    fn a_disk_pays_for_positioning_away_from_its_head() {
        let t0 = Instant::now();
        let mut m = model(Duration::ZERO, 1_000_000, None);
        m.seek = Some(Seek {
            min: 5 * MS,
            full_stroke: 16 * MS,
            track: 10_000,
        });
        let c = DeviceClock::new(m, 1_000_000, t0);
        // From the head's start, in order: transfers only (1 ms each).
        let a = c.schedule(t0, 0, 1000);
        assert_eq!(a, t0 + MS);
        let b = c.schedule(a, 1000, 1000);
        assert_eq!(b, a + MS);
        // A little ahead: the gap passes under the head (3 ms), then 1 ms.
        let near = c.schedule(b, 5000, 1000);
        assert_eq!(near, b + 4 * MS);
        // Just behind the head: a full positioning, not nearly a turn.
        let behind = c.schedule(near, 5000, 1000);
        assert!(behind - near >= 6 * MS, "{:?}", behind - near);
        // A quarter of the disk away: 5 ms + sqrt(1/4) x 16 ms, then 1 ms.
        let far = c.schedule(behind, 256_000, 1000);
        assert_eq!(far, behind + 14 * MS);
        // Back to the start: the full stroke is at most 5 + 16 ms.
        let back = c.schedule(far, 0, 1000);
        assert!(back - far > 14 * MS && back - far <= 22 * MS);
    }

    #[test]
    fn profiles_differ_where_their_devices_do() {
        let lat = |p: Profile| p.model().latency + p.model().transfer_time(4096);
        // A network round trip costs more than an SD card's read; a SATA SSD
        // answers fastest.
        assert!(lat(Profile::Cloud) > lat(Profile::Sd));
        assert!(lat(Profile::Sd) > lat(Profile::SataSsd));
        // The SD card moves the least data and takes one request at a time.
        assert!(Profile::Sd.model().bandwidth < Profile::Cloud.model().bandwidth);
        assert!(Profile::Cloud.model().bandwidth < Profile::SataSsd.model().bandwidth);
        assert_eq!(Profile::Sd.model().queue_depth, 1);
        // The host merges what waits for a card or a SATA disk; an NVMe
        // queue has no scheduler.
        assert!(Profile::Sd.model().merge > 0 && Profile::Hdd.model().merge > 0);
        assert_eq!(Profile::Cloud.model().merge, 0);
        assert!(Profile::Sd
            .model()
            .to_string()
            .ends_with("merges up to 512 KiB"));
        // Only the hard disk seeks, and a random 4 KiB read over it costs
        // about what such disks measure (75-80 IOPS at queue depth 1).
        assert!(Profile::ALL
            .iter()
            .all(|p| p.model().seek.is_some() == (*p == Profile::Hdd)));
        let hdd = Profile::Hdd.model();
        let seek = hdd.seek.unwrap();
        let mean = hdd.latency + seek.min + seek.full_stroke.mul_f64(0.53);
        assert!(mean > 12 * MS && mean < 14 * MS, "{mean:?}");
    }
}
