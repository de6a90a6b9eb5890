//! Measuring a testbed's device with fio, so results can be printed with
//! the figures of the device they ran on.
//!
//! Three read-only jobs on the loop device, each with O_DIRECT so neither
//! the page cache nor the loop's cache answers: 4 KiB random reads at queue
//! depth 1 (latency), 4 KiB random reads at queue depth 32 (IOPS, where the
//! queue depth and IOPS cap of a model show), and 1 MiB sequential reads at
//! queue depth 8 (bandwidth).

use std::fmt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{sys, Error};

/// How long each fio job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FioOptions {
    /// Run time of each of the three jobs.
    pub runtime: Duration,
}

impl Default for FioOptions {
    fn default() -> Self {
        FioOptions {
            runtime: Duration::from_secs(5),
        }
    }
}

/// Measured figures of a device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceFigures {
    /// 4 KiB random read at queue depth 1: mean completion latency, µs.
    pub rand4k_qd1_lat_us: f64,
    /// Same job: median completion latency, µs.
    pub rand4k_qd1_p50_us: f64,
    /// Same job: 99th percentile completion latency, µs.
    pub rand4k_qd1_p99_us: f64,
    /// Same job: I/O per second.
    pub rand4k_qd1_iops: f64,
    /// 4 KiB random read at queue depth 32: I/O per second.
    pub rand4k_qd32_iops: f64,
    /// 1 MiB sequential read at queue depth 8: MB/s (10^6 bytes).
    pub seq1m_mb_s: f64,
}

impl fmt::Display for DeviceFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "4k random read QD1 {:.0} us mean ({:.0} p50, {:.0} p99, {:.0} IOPS); \
             QD32 {:.0} IOPS; 1M sequential read {:.1} MB/s",
            self.rand4k_qd1_lat_us,
            self.rand4k_qd1_p50_us,
            self.rand4k_qd1_p99_us,
            self.rand4k_qd1_iops,
            self.rand4k_qd32_iops,
            self.seq1m_mb_s
        )
    }
}

/// Read figures of one fio job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobFigures {
    /// Mean completion latency, µs.
    pub clat_mean_us: f64,
    /// Median completion latency, µs.
    pub clat_p50_us: f64,
    /// 99th percentile completion latency, µs.
    pub clat_p99_us: f64,
    /// I/O per second.
    pub iops: f64,
    /// Bytes per second.
    pub bw_bytes: f64,
}

/// Parses the first job's read figures from `fio --output-format=json`.
pub fn parse_job(json: &str) -> Option<JobFigures> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let read = v.get("jobs")?.get(0)?.get("read")?;
    let clat = read.get("clat_ns")?;
    let pct = |k: &str| {
        clat.get("percentile")
            .and_then(|p| p.get(k))
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(f64::NAN)
            / 1000.0
    };
    Some(JobFigures {
        clat_mean_us: clat.get("mean")?.as_f64()? / 1000.0,
        clat_p50_us: pct("50.000000"),
        clat_p99_us: pct("99.000000"),
        iops: read.get("iops")?.as_f64()?,
        bw_bytes: read.get("bw_bytes")?.as_f64()?,
    })
}

fn run_job(
    dev: &Path,
    rw: &str,
    bs: &str,
    depth: u32,
    runtime: Duration,
) -> Result<JobFigures, Error> {
    let engine = if depth == 1 { "psync" } else { "libaio" };
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={rw}-{bs}-qd{depth}"))
        .arg(format!("--filename={}", dev.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--ioengine={engine}"))
        .arg(format!("--runtime={}ms", runtime.as_millis().max(1)))
        .args([
            "--direct=1",
            "--readonly",
            "--time_based",
            "--randrepeat=0",
            "--norandommap",
            "--output-format=json",
        ]);
    let out = sys::run(&mut cmd)?;
    parse_job(&out).ok_or(Error::Parse {
        path: dev.to_path_buf(),
        what: "fio JSON output",
    })
}

/// Runs the three jobs against `dev`.
pub fn measure(dev: &Path, opts: &FioOptions) -> Result<DeviceFigures, Error> {
    let qd1 = run_job(dev, "randread", "4k", 1, opts.runtime)?;
    let qd32 = run_job(dev, "randread", "4k", 32, opts.runtime)?;
    let seq = run_job(dev, "read", "1M", 8, opts.runtime)?;
    Ok(DeviceFigures {
        rand4k_qd1_lat_us: qd1.clat_mean_us,
        rand4k_qd1_p50_us: qd1.clat_p50_us,
        rand4k_qd1_p99_us: qd1.clat_p99_us,
        rand4k_qd1_iops: qd1.iops,
        rand4k_qd32_iops: qd32.iops,
        seq1m_mb_s: seq.bw_bytes / 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json() {
        let json = r#"{"fio version":"fio-3.33","jobs":[{"jobname":"x","read":{
            "io_bytes":4096,"bw_bytes":5734400,"iops":1400.5,
            "clat_ns":{"min":600000,"max":900000,"mean":714285.7,
              "percentile":{"50.000000":708608,"99.000000":806912}}}}]}"#;
        let j = parse_job(json).unwrap();
        assert!((j.clat_mean_us - 714.2857).abs() < 1e-3);
        assert!((j.clat_p50_us - 708.608).abs() < 1e-9);
        assert!((j.clat_p99_us - 806.912).abs() < 1e-9);
        assert_eq!(j.iops, 1400.5);
        assert_eq!(j.bw_bytes, 5734400.0);
        assert!(parse_job("{}").is_none());
    }
}
