//! `warmstart show`: traces (and plans) for people and for scripts.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;
use warmstart_plan::container::{Header, Kind, HEADER_LEN};
use warmstart_plan::{Entry, Plan, Trace};

use crate::cli::{Format, ShowArgs};
use crate::cmd::human_bytes;

pub fn run(args: ShowArgs) -> Result<i32> {
    let (header, bytes) = read_checked(&args.file)?;
    let mut out = std::io::stdout().lock();
    if header.kind == Kind::Plan {
        let plan = Plan::from_bytes(&bytes).with_context(|| format!("{}", args.file.display()))?;
        show_plan(&plan, bytes.len(), args.format, &mut out)?;
        return Ok(0);
    }
    let trace = Trace::from_bytes(&bytes).with_context(|| format!("{}", args.file.display()))?;
    match args.format {
        Format::Summary => summary(&trace, &mut out)?,
        Format::Table => table(&trace, &mut out)?,
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &trace_json(&trace))?;
            writeln!(out)?;
        }
        Format::Csv => csv(&trace, &mut out)?,
    }
    Ok(0)
}

/// Reads a trace or plan file, its header first: a foreign, future or
/// oversized file is refused from its first 24 bytes, and the body read is
/// never longer than the header promises (itself within the format's
/// limits), whatever the file's size.
fn read_checked(path: &Path) -> Result<(Header, Vec<u8>)> {
    let what = || format!("reading {}", path.display());
    let (mut f, md) = super::open_container(path)?;
    let header = Header::read(&mut f).with_context(|| format!("{}", path.display()))?;
    let promised = HEADER_LEN as u64 + header.len;
    anyhow::ensure!(
        md.len() <= promised,
        "{}: {} is corrupt: {} bytes follow the {} payload bytes its header promises",
        path.display(),
        header.kind,
        md.len() - promised,
        header.len
    );
    f.seek(SeekFrom::Start(0)).with_context(what)?;
    let (_, bytes) =
        warmstart_plan::container::read(&mut f).with_context(|| format!("{}", path.display()))?;
    Ok((header, bytes))
}

/// The public JSON form of a trace. Fields are only ever added.
pub fn trace_json(t: &Trace) -> serde_json::Value {
    json!({
        "format": "warmstart-trace",
        "version": format!("{}.{}", warmstart_plan::trace::TRACE_MAJOR, warmstart_plan::trace::TRACE_MINOR),
        "meta": {
            "command": t.meta.command,
            "cwd": t.meta.cwd,
            "backend": t.meta.backend.name(),
            "ordered": t.meta.backend != warmstart_plan::trace::Backend::Mincore,
            "cache": format!("{:?}", t.meta.cache).to_lowercase(),
            "end": format!("{:?}", t.meta.end).to_lowercase(),
            "exit_code": t.meta.exit_code,
            "started_unix_ms": t.meta.started_unix_ms,
            "hostname": t.meta.hostname,
        },
        "files": t.files.iter().map(|f| json!({
            "path": f.path,
            "dev": f.id.dev,
            "ino": f.id.ino,
            "size": f.id.size,
            "mtime_ns": f.id.mtime_ns,
            "ctime_ns": f.id.ctime_ns,
            "first_access_ns": f.first_ns(),
            "ranges": f.extents.iter().map(|e| [e.offset, e.len]).collect::<Vec<_>>(),
            "from_storage": f.extents.iter().map(|e| e.from_storage).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "metadata": t.metadata.iter().map(|m| json!({
            "device": m.device,
            "major": libc::major(m.device),
            "minor": libc::minor(m.device),
            "offset": m.offset,
            "length": m.len,
            "t_ns": m.t_ns,
        })).collect::<Vec<_>>(),
        "namespace_ops": t.namespace_ops.iter().map(|o| json!({
            "t_ns": o.t_ns,
            "op": o.kind.name(),
            "path": o.path,
            "result": o.result,
        })).collect::<Vec<_>>(),
        "stats": {
            "events": t.stats.events,
            "drops": t.stats.drops,
            "duration_ns": t.stats.duration_ns,
            "bytes": t.stats.bytes,
            "bytes_from_storage": t.stats.bytes_from_storage,
            "metadata_bytes": t.stats.metadata_bytes,
            "pages": t.stats.pages,
            "pages_unresolved": t.stats.pages_unresolved,
            "processes": t.stats.processes,
        },
    })
}

fn summary(t: &Trace, out: &mut impl Write) -> Result<()> {
    let s = &t.stats;
    writeln!(out, "trace of:     {}", t.meta.command.join(" "))?;
    writeln!(
        out,
        "recorded:     {} backend{}, cache {:?}, ended by {:?}, exit {}",
        t.meta.backend.name(),
        if t.meta.backend == warmstart_plan::trace::Backend::Mincore {
            " (UNORDERED snapshot)"
        } else {
            ""
        },
        t.meta.cache,
        t.meta.end,
        t.meta.exit_code.map_or("-".into(), |c| c.to_string())
    )?;
    writeln!(
        out,
        "duration:     {:.3} s, {} processes",
        s.duration_ns as f64 / 1e9,
        s.processes
    )?;
    writeln!(
        out,
        "data:         {} in {} files, {} ranges ({} read from storage)",
        human_bytes(s.bytes),
        t.files.len(),
        t.files.iter().map(|f| f.extents.len()).sum::<usize>(),
        human_bytes(s.bytes_from_storage)
    )?;
    writeln!(
        out,
        "metadata:     {} in {} extents",
        human_bytes(s.metadata_bytes),
        t.metadata.len()
    )?;
    writeln!(
        out,
        "lookups:      {} ({} failed)",
        t.namespace_ops.len(),
        t.namespace_ops.iter().filter(|o| o.result < 0).count()
    )?;
    writeln!(
        out,
        "events:       {} ({} dropped, {} pages unnamed)",
        s.events, s.drops, s.pages_unresolved
    )?;
    let mut top: Vec<_> = t.files.iter().collect();
    top.sort_by_key(|f| std::cmp::Reverse(f.bytes()));
    writeln!(out, "largest files:")?;
    for f in top.iter().take(8) {
        writeln!(
            out,
            "  {:>10}  {}",
            human_bytes(f.bytes()),
            f.path.as_deref().unwrap_or("?")
        )?;
    }
    Ok(())
}

fn table(t: &Trace, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "{:>10} {:>8} {:>12} {:>10}  path",
        "t_ms", "kind", "offset", "length"
    )?;
    let mut rows: Vec<(u64, String)> = Vec::new();
    for f in &t.files {
        let p = f.path.as_deref().unwrap_or("?");
        for e in &f.extents {
            // Pages read ahead by the kernel and never used sort last.
            let t_ms = if e.t_ns >= warmstart_plan::trace::NEVER_USED {
                "unused".to_string()
            } else {
                format!("{:.3}", e.t_ns as f64 / 1e6)
            };
            rows.push((
                e.t_ns,
                format!(
                    "{:>10} {:>8} {:>12} {:>10}  {}",
                    t_ms,
                    if e.from_storage { "read" } else { "cached" },
                    e.offset,
                    e.len,
                    p
                ),
            ));
        }
    }
    for m in &t.metadata {
        rows.push((
            m.t_ns,
            format!(
                "{:>10.3} {:>8} {:>12} {:>10}  [{}:{}]",
                m.t_ns as f64 / 1e6,
                "meta",
                m.offset,
                m.len,
                libc::major(m.device),
                libc::minor(m.device)
            ),
        ));
    }
    for o in &t.namespace_ops {
        rows.push((
            o.t_ns,
            format!(
                "{:>10.3} {:>8} {:>12} {:>10}  {}",
                o.t_ns as f64 / 1e6,
                o.kind.name(),
                "",
                if o.result < 0 {
                    o.result.to_string()
                } else {
                    String::new()
                },
                o.path
            ),
        ));
    }
    rows.sort_by_key(|r| r.0);
    for (_, r) in rows {
        writeln!(out, "{r}")?;
    }
    Ok(())
}

fn csv(t: &Trace, out: &mut impl Write) -> Result<()> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record([
        "kind",
        "path",
        "device",
        "offset",
        "length",
        "t_ns",
        "from_storage",
        "result",
    ])?;
    for f in &t.files {
        for e in &f.extents {
            w.write_record([
                "data",
                f.path.as_deref().unwrap_or(""),
                &f.id.dev.to_string(),
                &e.offset.to_string(),
                &e.len.to_string(),
                &e.t_ns.to_string(),
                &e.from_storage.to_string(),
                "",
            ])?;
        }
    }
    for m in &t.metadata {
        w.write_record([
            "metadata",
            "",
            &m.device.to_string(),
            &m.offset.to_string(),
            &m.len.to_string(),
            &m.t_ns.to_string(),
            "true",
            "",
        ])?;
    }
    for o in &t.namespace_ops {
        w.write_record([
            o.kind.name(),
            &o.path,
            "",
            "",
            "",
            &o.t_ns.to_string(),
            "",
            &o.result.to_string(),
        ])?;
    }
    w.flush()?;
    Ok(())
}

/// The public JSON form of a plan. Fields are only ever added.
pub fn plan_json(p: &Plan) -> serde_json::Value {
    json!({
        "format": "warmstart-plan",
        "version": format!("{}.{}", warmstart_plan::plan::PLAN_MAJOR, warmstart_plan::plan::PLAN_MINOR),
        "meta": {
            "command": p.meta.command,
            "created_unix_ms": p.meta.created_unix_ms,
            "traces": p.meta.traces,
            "min_traces": p.meta.min_traces,
            "passes": p.meta.passes,
            "sorted": p.meta.sorted,
        },
        "files": p.files.iter().map(|f| json!({
            "path": f.path, "dev": f.id.dev, "ino": f.id.ino, "size": f.id.size,
            "mtime_ns": f.id.mtime_ns, "ctime_ns": f.id.ctime_ns,
        })).collect::<Vec<_>>(),
        "lookups": p.lookups.iter().map(|l| json!({"op": l.kind.name(), "path": l.path})).collect::<Vec<_>>(),
        "entries": p.entries.iter().map(|e| match *e {
            Entry::Data { file, offset, len } => json!({"kind": "data", "file": file, "offset": offset, "length": len}),
            Entry::Meta { device, offset, len } => json!({"kind": "metadata", "device": device, "offset": offset, "length": len}),
            Entry::Lookup { index } => json!({"kind": "lookup", "lookup": index}),
        }).collect::<Vec<_>>(),
    })
}

fn entry_row(p: &Plan, e: &Entry) -> [String; 4] {
    match *e {
        Entry::Data { file, offset, len } => [
            "data".into(),
            p.files[file as usize].path.clone(),
            offset.to_string(),
            len.to_string(),
        ],
        Entry::Meta {
            device,
            offset,
            len,
        } => [
            "metadata".into(),
            format!("[{}:{}]", libc::major(device), libc::minor(device)),
            offset.to_string(),
            len.to_string(),
        ],
        Entry::Lookup { index } => {
            let l = &p.lookups[index as usize];
            [
                l.kind.name().into(),
                l.path.clone(),
                String::new(),
                String::new(),
            ]
        }
    }
}

fn show_plan(p: &Plan, size: usize, format: Format, out: &mut impl Write) -> Result<()> {
    match format {
        Format::Summary => {
            writeln!(out, "plan for:     {}", p.meta.command.join(" "))?;
            writeln!(
                out,
                "made from:    {} traces (kept what {} had), {}",
                p.meta.traces,
                p.meta.min_traces,
                if p.meta.sorted {
                    "physical order"
                } else {
                    "access order"
                }
            )?;
            writeln!(out, "passes:       {}", p.meta.passes.join("; "))?;
            writeln!(
                out,
                "schedule:     {} entries: {} data in {} files, {} metadata, {} lookups",
                p.entries.len(),
                human_bytes(p.data_bytes()),
                p.files.len(),
                human_bytes(p.meta_bytes()),
                p.lookups.len()
            )?;
            writeln!(out, "plan size:    {}", human_bytes(size as u64))?;
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &with_metadata_paths(p, plan_json(p)))?;
            writeln!(out)?;
        }
        Format::Table => {
            writeln!(
                out,
                "{:>6} {:>9} {:>12} {:>10}  path",
                "#", "kind", "offset", "length"
            )?;
            for (i, e) in p.entries.iter().enumerate() {
                let [k, path, off, len] = entry_row(p, e);
                writeln!(out, "{i:>6} {k:>9} {off:>12} {len:>10}  {path}")?;
            }
        }
        Format::Csv => {
            let mut w = csv::Writer::from_writer(&mut *out);
            w.write_record(["kind", "path", "offset", "length"])?;
            for e in &p.entries {
                w.write_record(entry_row(p, e))?;
            }
            w.flush()?;
        }
    }
    metadata_section(p, format, out)
}

/// Which path each device's metadata takes on this machine (read from the
/// block device, or left to the plan's path lookups, and why), for
/// `show` and `status`. Nothing is read; a device that would be read is
/// opened and closed to find out whether it can be.
pub struct MetadataPaths {
    pub devices: Vec<(warmstart_replay::MetaDevice, Option<std::path::PathBuf>)>,
}

impl MetadataPaths {
    pub fn of(plan: &Plan, backend: &warmstart_replay::RealBackend) -> MetadataPaths {
        MetadataPaths {
            devices: warmstart_replay::metadata_paths(plan, backend)
                .into_iter()
                .map(|d| {
                    let node = backend.device_node(d.device);
                    (d, node)
                })
                .collect(),
        }
    }

    /// How many workers a replay of the plan starts by default on this
    /// machine, and why: fewer where most of its metadata is read from
    /// its devices first (see `warmstart_replay::Options::workers_metadata_read`).
    pub fn default_workers(&self) -> (usize, String) {
        let read = warmstart_replay::metadata_mostly_read(self.devices.iter().map(|(d, _)| d));
        let o = warmstart_replay::Options::default();
        let workers = o.pool(read).0;
        let why = match o.spare(read) {
            Some(after) => format!(
                "the metadata is read from its devices first, so opens and lookups do not wait; \
                 one more thread steps in while an open has waited {} µs",
                after.as_micros()
            ),
            None if read => {
                "the metadata is read from its devices first, so opens and lookups do not wait"
                    .into()
            }
            None => "path lookups read the metadata, one at a time each".into(),
        };
        (workers, why)
    }

    /// One JSON object per device: `MetaDevice`'s fields (without the
    /// request counts of a replay, which a dry look has none of), the
    /// device node, and the sentence [`metadata_line`] prints.
    pub fn json(&self) -> Vec<serde_json::Value> {
        self.devices
            .iter()
            .map(|(d, node)| {
                let mut v = serde_json::to_value(d).expect("serializes");
                if let Some(o) = v.as_object_mut() {
                    o.remove("requests");
                    o.remove("requested_bytes");
                    o.insert("node".into(), json!(node));
                    o.insert("summary".into(), json!(metadata_line(d, node.as_deref())));
                }
                v
            })
            .collect()
    }
}

/// `metadata on /dev/vda (ext4): not openable (EPERM): warmed by path
/// lookups instead`.
pub fn metadata_line(d: &warmstart_replay::MetaDevice, node: Option<&std::path::Path>) -> String {
    use warmstart_replay::MetaPath;
    let on = match node {
        Some(n) => n.display().to_string(),
        None => d.name.clone(),
    };
    let fs = d.fs_type.as_deref().unwrap_or("no filesystem mounted");
    let instead = "warmed by path lookups instead";
    let how = match &d.path {
        MetaPath::DeviceRead => "read from the device at the start of the replay".to_string(),
        MetaPath::NotOpenable { error } => format!("not openable ({}): {instead}", errno_of(error)),
        MetaPath::FilesystemUnsupported { fs_type } => format!(
            "not read from the device ({fs_type} keeps its metadata in a cache of its own): {instead}"
        ),
        MetaPath::NotReached => "not reached".to_string(),
    };
    format!("metadata on {on} ({fs}): {how}")
}

/// The errno name in an error message ending in `(os error N)`, else the
/// message's last part (what the OS layer said the node is instead).
fn errno_of(error: &str) -> String {
    let n = error
        .rsplit_once("(os error ")
        .and_then(|(_, r)| r.strip_suffix(')'))
        .and_then(|n| n.parse::<i32>().ok());
    let name = match n {
        Some(libc::EPERM) => "EPERM",
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::EIO) => "EIO",
        Some(libc::ENXIO) => "ENXIO",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::ENODEV) => "ENODEV",
        Some(libc::EROFS) => "EROFS",
        Some(libc::ENOMEDIUM) => "ENOMEDIUM",
        Some(n) => return std::io::Error::from_raw_os_error(n).to_string(),
        None => return error.rsplit(": ").next().unwrap_or(error).to_string(),
    };
    name.to_string()
}

/// `show PLAN --format json`: the plan's JSON form with a `metadata`
/// array, one object per device (see [`MetadataPaths::json`]).
fn with_metadata_paths(p: &Plan, mut doc: serde_json::Value) -> serde_json::Value {
    if let (Some(paths), Some(o)) = (metadata_paths_of(p), doc.as_object_mut()) {
        o.insert("metadata".into(), json!(paths.json()));
        o.insert("replay_workers".into(), json!(paths.default_workers().0));
    }
    doc
}

/// The metadata section of `show PLAN` in the summary and the table: one
/// line per device. Nothing for CSV, whose rows are entries, nor JSON
/// (see [`with_metadata_paths`]).
fn metadata_section(p: &Plan, format: Format, out: &mut impl Write) -> Result<()> {
    if !matches!(format, Format::Summary | Format::Table) {
        return Ok(());
    }
    let Some(paths) = metadata_paths_of(p) else {
        return Ok(());
    };
    if format == Format::Table {
        writeln!(out)?;
    }
    for (d, node) in &paths.devices {
        writeln!(
            out,
            "{} [{} entries, {}]",
            metadata_line(d, node.as_deref()),
            d.planned.entries,
            human_bytes(d.planned.bytes)
        )?;
    }
    let (workers, why) = paths.default_workers();
    writeln!(out, "replay workers: {workers} ({why})")?;
    Ok(())
}

fn metadata_paths_of(p: &Plan) -> Option<MetadataPaths> {
    p.entries
        .iter()
        .any(|e| matches!(e, Entry::Meta { .. }))
        .then(|| MetadataPaths::of(p, &warmstart_replay::RealBackend::new()))
}

#[cfg(test)]
mod metadata_tests {
    use super::*;
    use warmstart_replay::{Count, MetaDevice, MetaPath};

    #[test]
    fn one_line_per_metadata_path() {
        let dev = |fs: Option<&str>, path| MetaDevice {
            device: libc::makedev(254, 0),
            name: "254:0".into(),
            fs_type: fs.map(Into::into),
            path,
            planned: Count::default(),
            ranges: 0,
            requests: 0,
            requested_bytes: 0,
        };
        let vda = Some(std::path::Path::new("/dev/vda"));
        let refused =
            "cannot open block device 254:0 (/dev/vda): Operation not permitted (os error 1)";
        let cases = [
            (
                dev(Some("ext4"), MetaPath::NotOpenable { error: refused.into() }),
                vda,
                "metadata on /dev/vda (ext4): not openable (EPERM): warmed by path lookups instead",
            ),
            (
                dev(Some("ext4"), MetaPath::DeviceRead),
                None,
                "metadata on 254:0 (ext4): read from the device at the start of the replay",
            ),
            (
                dev(Some("btrfs"), MetaPath::FilesystemUnsupported { fs_type: "btrfs".into() }),
                vda,
                "metadata on /dev/vda (btrfs): not read from the device (btrfs keeps its \
                 metadata in a cache of its own): warmed by path lookups instead",
            ),
            (
                dev(None, MetaPath::NotOpenable {
                    error: "cannot open block device 254:0 (/dev/vda): /dev/vda is a character device, not a block device".into(),
                }),
                vda,
                "metadata on /dev/vda (no filesystem mounted): not openable (/dev/vda is a \
                 character device, not a block device): warmed by path lookups instead",
            ),
        ];
        for (d, node, want) in cases {
            assert_eq!(metadata_line(&d, node), want);
        }
        assert_eq!(errno_of("x (os error 13)"), "EACCES");
        assert_eq!(
            errno_of("x (os error 7)"),
            "Argument list too long (os error 7)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_plan::plan::{PlanFile, PlanMeta};
    use warmstart_plan::trace::FileId;

    fn plan_bytes() -> Vec<u8> {
        Plan {
            meta: PlanMeta {
                command: vec!["app".into()],
                created_unix_ms: 0,
                traces: 1,
                min_traces: 1,
                passes: Vec::new(),
                sorted: false,
            },
            files: vec![PlanFile {
                path: "/usr/bin/app".into(),
                id: FileId {
                    dev: 1,
                    ino: 2,
                    size: 8192,
                    ..Default::default()
                },
            }],
            lookups: Vec::new(),
            entries: vec![Entry::Data {
                file: 0,
                offset: 0,
                len: 8192,
            }],
        }
        .to_bytes()
    }

    /// Writes `head` and makes the file `size` bytes long (sparse).
    fn file(dir: &Path, name: &str, head: &[u8], size: u64) -> std::path::PathBuf {
        let p = dir.join(name);
        let f = std::fs::File::create(&p).unwrap();
        (&f).write_all(head).unwrap();
        f.set_len(size.max(head.len() as u64)).unwrap();
        p
    }

    #[test]
    fn the_header_is_read_before_the_body() {
        let d = tempfile::tempdir().unwrap();
        let good = plan_bytes();
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&(4u64 << 30).to_le_bytes());
        // Sparse files of 4 GiB: reading them whole would take seconds and
        // gigabytes; the header alone refuses them.
        let cases = [
            ("good", file(d.path(), "good", &good, 0), None),
            (
                "promises 4 GiB",
                file(d.path(), "huge", &huge, (4 << 30) + 24),
                Some("more than the limit"),
            ),
            (
                "a good plan with 4 GiB after it",
                file(d.path(), "tail", &good, 4 << 30),
                Some("bytes follow"),
            ),
            (
                "foreign",
                file(d.path(), "elf", b"\x7fELF\x02\x01\x01\0", 4 << 30),
                Some("not a warmstart trace or plan"),
            ),
            ("empty", file(d.path(), "empty", b"", 0), Some("too short")),
        ];
        for (name, path, want) in cases {
            match (read_checked(&path), want) {
                (Ok((h, bytes)), None) => {
                    assert_eq!(h.kind, Kind::Plan, "{name}");
                    assert_eq!(bytes, good, "{name}");
                    Plan::from_bytes(&bytes).unwrap();
                }
                (Err(e), Some(want)) => {
                    let e = format!("{e:#}");
                    assert!(e.contains(want), "{name}: {e}");
                }
                (got, _) => panic!("{name}: {:?}", got.map(|(h, _)| h)),
            }
        }
    }
}
