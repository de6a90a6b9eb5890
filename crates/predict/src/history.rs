//! The launch history: what started, when, and after which startup.
//!
//! Stored as JSON lines so a file cut short by a crash or a full disk
//! loses only its last line: [`History::decode`] keeps every line that
//! parses and counts the rest, so a damaged history is rebuilt from what
//! is left, with a warning, never an error that stops the daemon.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// What began a startup window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartupKind {
    /// The machine (and the daemon with it) started.
    Boot,
    /// A user's login session started (a new audit session id at exec).
    Login,
}

/// The start of a boot or a login session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Startup {
    pub kind: StartupKind,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The session it began (audit session id), 0 for a boot.
    #[serde(default)]
    pub session: u32,
}

/// One launch of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The profile's name, as the store keys it.
    pub profile: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The audit session id of the launching process.
    #[serde(default)]
    pub session: u32,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Startup(Startup),
    Launch(Launch),
}

impl Event {
    pub fn at_ms(&self) -> u64 {
        match self {
            Event::Startup(s) => s.at_ms,
            Event::Launch(l) => l.at_ms,
        }
    }
}

/// Why a history could not be written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot encode a history event: {0}")]
    Encode(#[from] serde_json::Error),
}

/// A bounded history: the oldest events go first when it is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    events: VecDeque<Event>,
    capacity: usize,
}

/// What [`History::decode`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub history: History,
    /// Lines that did not parse (damaged, or from a newer format) and were
    /// dropped.
    pub dropped_lines: usize,
}

/// Longest profile name kept; longer lines are dropped on decode as
/// damaged rather than kept at any size.
pub const MAX_PROFILE_LEN: usize = 255;

impl History {
    /// An empty history keeping at most `capacity` events (at least 1).
    pub fn new(capacity: usize) -> Self {
        History {
            events: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, event: Event) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    pub fn events(&self) -> impl ExactSizeIterator<Item = &Event> + DoubleEndedIterator {
        self.events.iter()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The history as JSON lines, oldest first.
    pub fn encode(&self) -> Result<String, HistoryError> {
        let mut out = String::new();
        for e in &self.events {
            out.push_str(&serde_json::to_string(e)?);
            out.push('\n');
        }
        Ok(out)
    }

    /// Reads JSON lines, keeping what parses. Events out of time order are
    /// dropped too: a predictor fed a clock that jumped back would learn
    /// transitions that never happened.
    pub fn decode(text: &str, capacity: usize) -> Decoded {
        let mut history = History::new(capacity);
        let mut dropped_lines = 0;
        let mut last_ms = 0;
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(line) {
                Ok(e) if e.at_ms() >= last_ms && plausible(&e) => {
                    last_ms = e.at_ms();
                    history.push(e);
                }
                _ => dropped_lines += 1,
            }
        }
        Decoded {
            history,
            dropped_lines,
        }
    }
}

fn plausible(e: &Event) -> bool {
    match e {
        Event::Startup(_) => true,
        Event::Launch(l) => !l.profile.is_empty() && l.profile.len() <= MAX_PROFILE_LEN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(p: &str, at_ms: u64) -> Event {
        Event::Launch(Launch {
            profile: p.into(),
            at_ms,
            session: 3,
        })
    }

    #[test]
    fn round_trip() {
        let mut h = History::new(10);
        h.push(Event::Startup(Startup {
            kind: StartupKind::Boot,
            at_ms: 1,
            session: 0,
        }));
        h.push(launch("gimp-1a2b", 5));
        let d = History::decode(&h.encode().unwrap(), 10);
        assert_eq!(d.history, h);
        assert_eq!(d.dropped_lines, 0);
    }

    #[test]
    fn bounded_drops_oldest() {
        let mut h = History::new(2);
        for i in 0..5 {
            h.push(launch("a", i));
        }
        let at: Vec<u64> = h.events().map(Event::at_ms).collect();
        assert_eq!(at, vec![3, 4]);
    }

    #[test]
    fn damaged_lines_are_dropped_and_counted() {
        let text = concat!(
            "{\"event\":\"launch\",\"profile\":\"a\",\"at_ms\":10}\n",
            "{\"event\":\"launch\",\"profile\":\"b\",\"at_\n", // cut short
            "garbage\n",
            "{\"event\":\"launch\",\"profile\":\"c\",\"at_ms\":5}\n", // clock went back
            "{\"event\":\"launch\",\"profile\":\"\",\"at_ms\":20}\n", // no name
            "{\"event\":\"future_kind\",\"at_ms\":30}\n",
            "\n",
            "{\"event\":\"launch\",\"profile\":\"d\",\"at_ms\":40}\n",
        );
        let d = History::decode(text, 100);
        let names: Vec<&str> = d
            .history
            .events()
            .filter_map(|e| match e {
                Event::Launch(l) => Some(l.profile.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec!["a", "d"]);
        assert_eq!(d.dropped_lines, 5);
    }

    #[test]
    fn oversized_names_are_dropped() {
        let long = "x".repeat(MAX_PROFILE_LEN + 1);
        let text = serde_json::to_string(&launch(&long, 1)).unwrap();
        let d = History::decode(&text, 10);
        assert!(d.history.is_empty());
        assert_eq!(d.dropped_lines, 1);
    }

    #[test]
    fn binary_garbage_gives_an_empty_history() {
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
        let text = String::from_utf8_lossy(&bytes);
        let d = History::decode(&text, 10);
        assert!(d.history.is_empty());
        assert!(d.dropped_lines > 0);
    }
}
