//! `export`, `import`, `push`, `pull` and `changed`: plans that travel to
//! machines with the same files, and plans kept fresh when files change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use warmstart_launch::daemon::{Reply, Request};
use warmstart_launch::store::{valid_name, write_atomic};
use warmstart_launch::{Phase, Profile, Store};
use warmstart_plan::Plan;
use warmstart_portable::format::{self, PortablePlan};
use warmstart_portable::oci::program_key;
use warmstart_portable::{Client, Reference};

use super::human_bytes;
use super::manage::{ask_daemon, socket_of, store};
use crate::cli::{ChangedArgs, ExportArgs, ImportArgs, ImportTarget, PullArgs, PushArgs};

/// The state directory: as given, else the running daemon's (its
/// profiles are the ones launches use), else the default of `status`.
/// With the socket of a daemon that uses this directory, to tell it.
fn resolve(dir: &Option<PathBuf>, socket: &Option<PathBuf>) -> Result<(Store, Option<PathBuf>)> {
    let sock = socket_of(socket);
    let daemon = warmstart_launch::daemon::query_checked(&sock)
        .ok()
        .flatten();
    let store = match (dir, &daemon) {
        (Some(_), _) | (None, None) => store(dir)?,
        (None, Some(d)) => Store::at(&d.state_dir),
    };
    let same = daemon.is_some_and(|d| {
        std::fs::canonicalize(&d.state_dir).ok() == std::fs::canonicalize(store.root()).ok()
    });
    Ok((store, same.then_some(sock)))
}

/// A profile's plan, with a message that says why there is none.
fn profile_plan(store: &Store, name: &str) -> Result<Plan> {
    if !valid_name(name) {
        bail!("invalid profile name {name:?} (see `warmstart status`)");
    }
    let prof = store.load(name)?.with_context(|| {
        format!(
            "no profile named {name} in {} (see `warmstart status`)",
            store.root().display()
        )
    })?;
    if prof.phase != Phase::Prefetching {
        bail!(
            "profile {name} has no plan to export: it is {}",
            prof.note.as_deref().unwrap_or(match prof.phase {
                Phase::Learning => "learning",
                _ => "ignored (too small a launch to prefetch)",
            })
        );
    }
    let path = store.plan_path(name);
    let bytes = super::read_container(&path)?;
    Plan::from_bytes(&bytes).with_context(|| format!("reading {}", path.display()))
}

/// Makes profile `name`'s plan portable, saying what was left out.
fn portable(store: &Store, name: &str, quiet: bool) -> Result<PortablePlan> {
    let plan = profile_plan(store, name)?;
    let (pp, notes) = format::export(name, &plan)?;
    for d in &notes.files {
        eprintln!("warmstart: left out {}: {}", d.path, d.why);
    }
    for l in &notes.lookups {
        eprintln!("warmstart: left out lookup {l:?}: not an absolute path without `..`");
    }
    if !quiet && notes.meta_entries > 0 {
        eprintln!(
            "warmstart: left out {} metadata reads (block addresses on this machine's disks)",
            notes.meta_entries
        );
    }
    Ok(pp)
}

fn summary(pp: &PortablePlan) -> String {
    let bytes: u64 = pp
        .entries
        .iter()
        .map(|e| match e {
            warmstart_plan::Entry::Data { len, .. } => *len,
            _ => 0,
        })
        .sum();
    format!(
        "{} files, {} of data, {} lookups",
        pp.files.len(),
        human_bytes(bytes),
        pp.lookups.len()
    )
}

pub fn export(args: ExportArgs, quiet: bool) -> Result<i32> {
    let (store, _) = resolve(&args.state_dir, &None)?;
    let pp = portable(&store, &args.profile, quiet)?;
    write_atomic(&args.output, &pp.to_bytes())?;
    if !quiet {
        eprintln!(
            "exported {} ({}) to {}",
            args.profile,
            summary(&pp),
            args.output.display()
        );
    }
    Ok(0)
}

pub fn import(args: ImportArgs, quiet: bool) -> Result<i32> {
    let pp = format::read_file(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    install(&pp, &args.target, &args.file.display().to_string(), quiet)
}

/// Checks `pp` against this machine's files and writes what passes as a
/// prefetching profile.
fn install(pp: &PortablePlan, t: &ImportTarget, source: &str, quiet: bool) -> Result<i32> {
    let name = t.name.clone().unwrap_or_else(|| pp.profile.clone());
    if !valid_name(&name) {
        bail!("invalid profile name {name:?}: use letters, digits, '-', '_' or '.'");
    }
    let (at, socket) = resolve(&t.state_dir, &t.socket)?;
    let imp = format::import(pp, Path::new("/"))?;
    for d in &imp.dropped {
        eprintln!("warmstart: dropped {}: {}", d.path, d.why);
    }
    if imp.plan.files.is_empty() {
        bail!(
            "none of the plan's {} files is the same here; nothing imported",
            pp.files.len()
        );
    }
    let store = Store::open(at.root())?;
    let exists = !matches!(store.load(&name), Ok(None));
    if exists && !t.force {
        bail!(
            "a profile named {name} exists in {}; give --force to replace it, or --name",
            store.root().display()
        );
    }
    if exists {
        store.forget(&name)?;
    }
    let bytes = imp.plan.to_bytes();
    let dir = store.dir(&name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write_atomic(&store.plan_path(&name), &bytes)?;
    let mut prof = Profile::new(&name, &pp.meta.command);
    prof.phase = Phase::Prefetching;
    prof.plan_bytes = Some(bytes.len() as u64);
    prof.note = Some(format!(
        "imported from {source}: {} of {} files, {} of {}",
        imp.plan.files.len(),
        pp.files.len(),
        human_bytes(imp.kept_bytes),
        human_bytes(imp.total_bytes)
    ));
    store.save(&mut prof)?;
    if let Some(sock) = socket {
        ask_daemon(
            &sock,
            &Request::Refresh {
                names: vec![name.clone()],
                relearn: None,
            },
        )?;
    }
    if !quiet {
        eprintln!(
            "imported {name}: {} of {} files ({} of {} of data), {} dropped; prefetched from its next launch",
            imp.plan.files.len(),
            pp.files.len(),
            human_bytes(imp.kept_bytes),
            human_bytes(imp.total_bytes),
            imp.dropped.len()
        );
    }
    Ok(0)
}

fn client(reference: &str, r: &crate::cli::RegistryArgs) -> Result<Client> {
    let reference = Reference::parse(reference)?;
    Ok(Client::new(
        reference,
        Duration::from_secs(r.timeout.max(1)),
        r.plain_http,
    )?)
}

pub fn push(args: PushArgs, quiet: bool) -> Result<i32> {
    let (store, _) = resolve(&args.state_dir, &None)?;
    let pp = portable(&store, &args.profile, quiet)?;
    let mut c = client(&args.reference, &args.registry)?;
    // Also found by content: the tag every machine with the same
    // executable computes for the same command line.
    let key = match find_program(&pp.meta.command) {
        Some(exe) => match program_key(&exe, &pp.meta.command[1..]) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("warmstart: not tagged by program: {e}");
                None
            }
        },
        None => None,
    };
    let digest = c.push(&pp, key.as_slice())?;
    let r = c.reference();
    if !quiet {
        eprintln!("pushed {} ({}) to {r}", args.profile, summary(&pp));
        if let Some(k) = &key {
            eprintln!("tagged {k} for {}", pp.meta.command.join(" "));
        }
    }
    // The pinned reference, for `pull` on the other machines.
    println!("{}/{}@{digest}", r.registry, r.repository);
    Ok(0)
}

/// The executable `command` runs: its first word as a path, or looked up
/// in PATH as a shell would.
pub(super) fn find_program(command: &[String]) -> Option<PathBuf> {
    let prog = command.first()?;
    if prog.contains('/') {
        return Some(PathBuf::from(prog));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

pub fn pull(args: PullArgs, quiet: bool) -> Result<i32> {
    let mut reference = args.reference.clone();
    if !args.command.is_empty() {
        let r = Reference::parse(&reference)?;
        if r.tag.is_some() || r.digest.is_some() {
            bail!("with a command, give a repository without a tag or digest: {reference}");
        }
        let exe = find_program(&args.command)
            .with_context(|| format!("{}: no such program", args.command[0]))?;
        let key = program_key(&exe, &args.command[1..])?;
        reference = format!("{}/{}:{key}", r.registry, r.repository);
    }
    let mut c = client(&reference, &args.registry)?;
    let (pp, digest) = c.pull()?;
    let r = c.reference();
    let source = format!("{}/{}@{digest}", r.registry, r.repository);
    if let Some(out) = &args.output {
        write_atomic(out, &pp.to_bytes())?;
        if !quiet {
            eprintln!("pulled {source} ({}) to {}", summary(&pp), out.display());
        }
        return Ok(0);
    }
    install(&pp, &args.target, &source, quiet)
}

/// The plan's files whose identity is no longer the recorded one.
fn changed_files(plan: &Plan) -> Vec<&str> {
    use std::os::unix::fs::MetadataExt;
    plan.files
        .iter()
        .filter(|f| {
            std::fs::metadata(&f.path).map_or(true, |m| {
                let id = (
                    m.dev(),
                    m.ino(),
                    m.size(),
                    m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                    m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                );
                id != (f.id.dev, f.id.ino, f.id.size, f.id.mtime_ns, f.id.ctime_ns)
            })
        })
        .map(|f| f.path.as_str())
        .collect()
}

pub fn changed(args: ChangedArgs, quiet: bool) -> Result<i32> {
    let (store, socket) = resolve(&args.state_dir, &args.socket)?;
    let mut errors = 0;
    for name in store.names().context("cannot read the state directory")? {
        let prof = match store.load(&name) {
            Ok(Some(p)) if p.phase == Phase::Prefetching => p,
            Ok(_) => continue,
            Err(e) => {
                eprintln!("warmstart: {e}");
                errors += 1;
                continue;
            }
        };
        // A plan that does not read is relearned at the next launch anyway.
        let Ok(plan) = super::read_container(&store.plan_path(&prof.name))
            .map_err(|e| e.to_string())
            .and_then(|b| Plan::from_bytes(&b).map_err(|e| e.to_string()))
        else {
            continue;
        };
        let changed = changed_files(&plan);
        let Some(first) = changed.first() else {
            continue;
        };
        let why = format!(
            "{} of its {} files changed ({first}{})",
            changed.len(),
            plan.files.len(),
            if changed.len() > 1 { ", ..." } else { "" }
        );
        if args.dry_run {
            println!("{name}: {why}");
            continue;
        }
        let relearned = match &socket {
            Some(sock) => {
                let req = Request::Refresh {
                    names: vec![name.clone()],
                    relearn: Some(why.clone()),
                };
                match ask_daemon(sock, &req)? {
                    Reply::Refreshed { relearned, .. } => relearned.contains(&name),
                    _ => bail!("the daemon answered something else than what was refreshed"),
                }
            }
            None => warmstart_launch::mark_relearn(&store, &name, &why)?,
        };
        if relearned && !quiet {
            println!("{name}: relearning: {why}");
        }
    }
    Ok(if errors > 0 { 1 } else { 0 })
}
