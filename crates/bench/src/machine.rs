//! The machine a benchmark ran on, recorded with the results: launch times
//! mean nothing without the storage and CPU they were measured on.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu: String,
    pub cores: usize,
    pub memory_bytes: u64,
    /// The block device holding `/`, its model, whether rotational, and
    /// its I/O scheduler.
    pub root_device: String,
    pub root_device_model: String,
    pub rotational: Option<bool>,
    pub scheduler: String,
    pub root_fs: String,
    /// Whether it runs under a hypervisor (storage is then virtual).
    pub virtualized: bool,
    pub date_unix_s: u64,
}

impl Machine {
    pub fn probe() -> Machine {
        Machine::probe_at(Path::new("/"))
    }

    /// Probes with `/proc` and `/sys` under `root` (a fixture in tests).
    pub fn probe_at(root: &Path) -> Machine {
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        let cpuinfo = read("proc/cpuinfo");
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let cores = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count();
        let memory_bytes = read("proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let (root_device, root_fs) = root_mount(&read("proc/self/mounts"));
        let disk = whole_disk(root, &root_device);
        let sys = |f: &str| read(&format!("sys/block/{disk}/{f}")).trim().to_string();
        let scheduler = sys("queue/scheduler");
        let scheduler = scheduler
            .split_whitespace()
            .find(|s| s.starts_with('['))
            .map(|s| s.trim_matches(['[', ']']).to_string())
            .unwrap_or(scheduler);
        Machine {
            hostname: read("proc/sys/kernel/hostname").trim().to_string(),
            kernel: read("proc/sys/kernel/osrelease").trim().to_string(),
            cpu: field("model name"),
            cores,
            memory_bytes,
            root_device: disk.clone(),
            root_device_model: sys("device/model"),
            rotational: match sys("queue/rotational").as_str() {
                "0" => Some(false),
                "1" => Some(true),
                _ => None,
            },
            scheduler,
            root_fs,
            virtualized: field("flags").split_whitespace().any(|f| f == "hypervisor"),
            date_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        format!(
            "{} ({} cores, {:.0} GiB RAM), Linux {}, / on {} ({}{}, {}, scheduler {}){}",
            if self.cpu.is_empty() {
                "unknown CPU"
            } else {
                &self.cpu
            },
            self.cores,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.kernel,
            self.root_device,
            match self.rotational {
                Some(true) => "rotational",
                Some(false) => "non-rotational",
                None => "unknown kind",
            },
            if self.root_device_model.is_empty() {
                String::new()
            } else {
                format!(" {}", self.root_device_model)
            },
            self.root_fs,
            self.scheduler,
            if self.virtualized {
                ", virtual machine"
            } else {
                ""
            }
        )
    }
}

/// The device and filesystem type mounted at `/` (the last such mount wins,
/// as it hides the ones below).
fn root_mount(mounts: &str) -> (String, String) {
    mounts
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[1] == "/").then(|| (f[0].to_string(), f[2].to_string()))
        })
        .unwrap_or_default()
}

/// `/dev/vda1` -> `vda`; `/dev/nvme0n1p2` -> `nvme0n1`: the disk whose
/// queue settings apply.
fn whole_disk(root: &Path, dev: &str) -> String {
    let name = dev.trim_start_matches("/dev/").to_string();
    if root.join("sys/block").join(&name).exists() {
        return name;
    }
    let Ok(entries) = std::fs::read_dir(root.join("sys/block")) else {
        return name;
    };
    for e in entries.flatten() {
        let disk = e.file_name().to_string_lossy().into_owned();
        if root.join("sys/block").join(&disk).join(&name).exists() {
            return disk;
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_a_fixture() {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &str| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w(
            "proc/cpuinfo",
            "processor\t: 0\nmodel name\t: Test CPU\nflags\t: fpu hypervisor\n\nprocessor\t: 1\nmodel name\t: Test CPU\n",
        );
        w("proc/meminfo", "MemTotal:       2048 kB\n");
        w(
            "proc/self/mounts",
            "proc /proc proc rw 0 0\n/dev/nvme0n1p2 / ext4 rw 0 0\n",
        );
        w("sys/block/nvme0n1/nvme0n1p2/dev", "259:2\n");
        w("sys/block/nvme0n1/device/model", "Fast Disk  \n");
        w("sys/block/nvme0n1/queue/rotational", "0\n");
        w("sys/block/nvme0n1/queue/scheduler", "[none] mq-deadline\n");
        w("proc/sys/kernel/osrelease", "6.1.0\n");
        let m = Machine::probe_at(d.path());
        assert_eq!(m.cpu, "Test CPU");
        assert_eq!(m.cores, 2);
        assert_eq!(m.memory_bytes, 2048 * 1024);
        assert_eq!(m.root_device, "nvme0n1");
        assert_eq!(m.root_device_model, "Fast Disk");
        assert_eq!(m.rotational, Some(false));
        assert_eq!(m.scheduler, "none");
        assert_eq!(m.root_fs, "ext4");
        assert!(m.virtualized);
        assert!(m.describe().contains("non-rotational Fast Disk"));
    }
}
