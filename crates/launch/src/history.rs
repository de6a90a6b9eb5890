//! The daemon's launch history on disk: `STATE_DIR/history.jsonl`.
//!
//! The predictor is rebuilt from this file at every daemon start, so it
//! must survive anything: a file cut short by a crash, a full disk, a
//! line from a newer version, garbage. Loading keeps every event that
//! parses ([`warmstart_predict::History::decode`]) and says how much was
//! lost in a warning; it never fails. Writing replaces the whole file
//! through [`crate::store::write_atomic`], so a crash leaves the old or
//! the new history, never half of one, and the file stays bounded by the
//! history's capacity instead of growing with every launch.

use std::io::Read;
use std::path::{Path, PathBuf};

use warmstart_predict::{Event, History, HistoryError};

use crate::store;

/// The file's name in the state directory.
pub const HISTORY_FILE: &str = "history.jsonl";

/// Events kept by default: months of launches for a desktop user (a few
/// dozen a day), about 300 KiB on disk, rewritten in a millisecond.
pub const DEFAULT_CAPACITY: usize = 4096;

/// At most this much of the file is read: a file grown beyond it (by
/// hand, or by a bug) is read from its tail, the newest events, instead
/// of filling the daemon's memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Why the history could not be saved. Loading has no error: see
/// [`HistoryFile::load`].
#[derive(Debug, thiserror::Error)]
pub enum HistoryFileError {
    #[error("{path}: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: HistoryError,
    },
    #[error(transparent)]
    Write(#[from] crate::Error),
}

/// The history held by the daemon, and where it is saved.
#[derive(Debug)]
pub struct HistoryFile {
    path: PathBuf,
    history: History,
    /// Events pushed since the last save.
    unsaved: usize,
}

impl HistoryFile {
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join(HISTORY_FILE)
    }

    /// Reads the history kept in `state_dir`. A missing file is an empty
    /// history; an unreadable or damaged one gives what could be read (maybe
    /// nothing) and a warning for the daemon's log, and is rewritten whole
    /// at the next save.
    pub fn load(state_dir: &Path, capacity: usize) -> (HistoryFile, Option<String>) {
        let path = Self::path_in(state_dir);
        let (text, mut warning) = match read_tail(&path) {
            Ok(Some((text, cut))) => {
                let w = cut.then(|| {
                    format!(
                        "{}: larger than {} MiB, only its newest events were read",
                        path.display(),
                        MAX_FILE_BYTES >> 20
                    )
                });
                (text, w)
            }
            Ok(None) => (String::new(), None),
            Err(e) => (
                String::new(),
                Some(format!(
                    "{}: unreadable ({e}); starting a new launch history",
                    path.display()
                )),
            ),
        };
        let decoded = History::decode(&text, capacity);
        if decoded.dropped_lines > 0 {
            let w = format!(
                "{}: {} damaged or out-of-order lines dropped, {} events kept",
                path.display(),
                decoded.dropped_lines,
                decoded.history.len()
            );
            warning = Some(match warning {
                Some(earlier) => format!("{earlier}; {w}"),
                None => w,
            });
        }
        // Rewritten at the next save, so the damage is not reported again.
        let unsaved = usize::from(warning.is_some());
        let file = HistoryFile {
            path,
            history: decoded.history,
            unsaved,
        };
        (file, warning)
    }

    pub fn history(&self) -> &History {
        &self.history
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events not saved yet.
    pub fn unsaved(&self) -> usize {
        self.unsaved
    }

    /// Adds an event in memory. An event older than the newest one (the
    /// wall clock was set back) is moved up to its time: decoding drops
    /// events out of order, so writing it as it came would lose it, and
    /// everything after it, at the next load.
    pub fn push(&mut self, mut event: Event) {
        let last = self.history.events().next_back().map(Event::at_ms);
        if let Some(last) = last.filter(|l| *l > event.at_ms()) {
            match &mut event {
                Event::Startup(s) => s.at_ms = last,
                Event::Launch(l) => l.at_ms = last,
            }
        }
        self.history.push(event);
        self.unsaved += 1;
    }

    /// Writes the whole history atomically.
    pub fn save(&mut self) -> Result<(), HistoryFileError> {
        let text = self
            .history
            .encode()
            .map_err(|source| HistoryFileError::Encode {
                path: self.path.clone(),
                source,
            })?;
        store::write_atomic(&self.path, text.as_bytes())?;
        self.unsaved = 0;
        Ok(())
    }

    /// [`push`](Self::push) then [`save`](Self::save).
    pub fn append(&mut self, event: Event) -> Result<(), HistoryFileError> {
        self.push(event);
        self.save()
    }
}

/// The file's text, from at most its last [`MAX_FILE_BYTES`] (starting at a
/// line boundary), and whether it was cut. `None` if it does not exist.
fn read_tail(path: &Path) -> std::io::Result<Option<(String, bool)>> {
    use std::io::{Seek, SeekFrom};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let cut = len > MAX_FILE_BYTES;
    if cut {
        f.seek(SeekFrom::Start(len - MAX_FILE_BYTES))?;
    }
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut bytes)?;
    if cut {
        // The first line is a piece of one: not counted as damage.
        let start = bytes
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| i + 1);
        bytes.drain(..start);
    }
    // Invalid UTF-8 only spoils the lines it is on: they fail to parse.
    Ok(Some((String::from_utf8_lossy(&bytes).into_owned(), cut)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmstart_predict::{Launch, Startup, StartupKind};

    fn launch(p: &str, at_ms: u64) -> Event {
        Event::Launch(Launch {
            profile: p.into(),
            at_ms,
            session: 2,
        })
    }

    #[test]
    fn saved_history_loads_back() {
        let d = tempfile::tempdir().unwrap();
        let (mut h, w) = HistoryFile::load(d.path(), 10);
        assert!(w.is_none(), "a missing file is a new history");
        assert!(h.history().is_empty());
        h.push(Event::Startup(Startup {
            kind: StartupKind::Boot,
            at_ms: 1,
            session: 0,
        }));
        h.append(launch("gimp", 5)).unwrap();
        assert_eq!(h.unsaved(), 0);
        let (again, w) = HistoryFile::load(d.path(), 10);
        assert!(w.is_none());
        assert_eq!(again.history(), h.history());
    }

    #[test]
    fn the_file_stays_bounded() {
        let d = tempfile::tempdir().unwrap();
        let (mut h, _) = HistoryFile::load(d.path(), 3);
        for i in 0..10 {
            h.append(launch("a", i)).unwrap();
        }
        let text = std::fs::read_to_string(h.path()).unwrap();
        assert_eq!(text.lines().count(), 3);
        let (again, _) = HistoryFile::load(d.path(), 3);
        let at: Vec<u64> = again.history().events().map(Event::at_ms).collect();
        assert_eq!(at, vec![7, 8, 9]);
    }

    #[test]
    fn a_corrupt_file_is_rebuilt_with_a_warning() {
        let d = tempfile::tempdir().unwrap();
        let path = HistoryFile::path_in(d.path());
        let mut text = serde_json::to_string(&launch("a", 10)).unwrap();
        text.push_str("\n{\"event\":\"launch\",\"prof\n\u{0}\u{1}garbage\n");
        text.push_str(&serde_json::to_string(&launch("b", 20)).unwrap());
        std::fs::write(&path, text).unwrap();
        let (mut h, w) = HistoryFile::load(d.path(), 10);
        let w = w.expect("damage is reported");
        assert!(w.contains("2 damaged"), "{w}");
        assert_eq!(h.history().len(), 2);
        assert_eq!(h.unsaved(), 1, "rewritten at the next save");
        h.save().unwrap();
        let (_, w) = HistoryFile::load(d.path(), 10);
        assert!(w.is_none(), "clean once saved: {w:?}");
    }

    #[test]
    fn an_unreadable_file_gives_an_empty_history_and_a_warning() {
        let d = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading it fails.
        std::fs::create_dir(HistoryFile::path_in(d.path())).unwrap();
        let (h, w) = HistoryFile::load(d.path(), 10);
        assert!(h.history().is_empty());
        assert!(w.unwrap().contains("unreadable"));
    }

    #[test]
    fn binary_garbage_is_survived() {
        let d = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..8192u32).map(|i| (i * 7919 % 256) as u8).collect();
        std::fs::write(HistoryFile::path_in(d.path()), bytes).unwrap();
        let (h, w) = HistoryFile::load(d.path(), 10);
        assert!(h.history().is_empty());
        assert!(w.is_some());
    }

    #[test]
    fn a_clock_set_back_does_not_lose_events() {
        let d = tempfile::tempdir().unwrap();
        let (mut h, _) = HistoryFile::load(d.path(), 10);
        h.push(launch("a", 100));
        h.push(launch("b", 50));
        h.save().unwrap();
        let (again, w) = HistoryFile::load(d.path(), 10);
        assert!(w.is_none());
        let at: Vec<u64> = again.history().events().map(Event::at_ms).collect();
        assert_eq!(at, vec![100, 100]);
    }

    #[test]
    fn an_oversized_file_is_read_from_its_tail() {
        let d = tempfile::tempdir().unwrap();
        let path = HistoryFile::path_in(d.path());
        let line = serde_json::to_string(&launch("a", 1)).unwrap() + "\n";
        let n = (MAX_FILE_BYTES as usize / line.len()) + 100;
        let mut text = line.repeat(n);
        text.push_str(&(serde_json::to_string(&launch("newest", 2)).unwrap() + "\n"));
        std::fs::write(&path, text).unwrap();
        let (h, w) = HistoryFile::load(d.path(), 5);
        assert!(w.unwrap().contains("newest events"));
        assert_eq!(h.history().events().next_back().map(Event::at_ms), Some(2));
    }
}
