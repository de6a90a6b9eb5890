//! When a launch's window is up (`--ready window:NAME`), from the X
//! server's own events: a client connected before the launch selects the
//! root window's substructure events, and each window mapped on it, or
//! renamed while mapped, has its name matched. Nothing runs while the
//! launch waits for its data, and a launch is complete when its window
//! is, not at the next probe.
//!
//! The `xdotool search` probe this replaces was a process spawned every
//! 20 ms: about 3 ms of CPU each on this two-vCPU machine (15% of a CPU
//! taken from the launch measured), 7–40 ms per answer, and on a cold
//! cache its own 3.4 MB of libraries read beside the launch's.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use anyhow::{Context, Result};
use regex_lite::Regex;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    AtomEnum, ChangeWindowAttributesAux, ConnectionExt as _, EventMask, MapState, Window,
};
use x11rb::protocol::Event;
use x11rb::rust_connection::RustConnection;

/// A connection to the X server that watches for a window by name.
pub struct WindowWatch {
    conn: RustConnection,
    name: Regex,
    /// `_NET_WM_NAME` (UTF-8, what toolkits set) beside `WM_NAME`.
    net_wm_name: u32,
    /// Windows on the root that are mapped.
    mapped: HashSet<Window>,
    /// A mapped window's name matched.
    found: bool,
}

impl WindowWatch {
    /// Connects to `display` (`None`: `$DISPLAY`) and starts watching for
    /// a mapped window whose name matches `pattern`, as `xdotool search
    /// --onlyvisible --name` does: a regular expression, case-insensitive.
    /// A window already up counts.
    pub fn start(display: Option<&str>, pattern: &str) -> Result<WindowWatch> {
        let name = Regex::new(&format!("(?i){pattern}"))
            .with_context(|| format!("bad window name pattern {pattern:?}"))?;
        let shown = display
            .map(str::to_string)
            .or_else(|| std::env::var("DISPLAY").ok())
            .unwrap_or_default();
        let (conn, screen) = x11rb::connect(display).with_context(|| {
            format!("cannot connect to the X display {shown:?} to watch for the launch's window")
        })?;
        let root = conn.setup().roots[screen].root;
        let net_wm_name = conn.intern_atom(false, b"_NET_WM_NAME")?.reply()?.atom;
        conn.change_window_attributes(
            root,
            &ChangeWindowAttributesAux::new().event_mask(EventMask::SUBSTRUCTURE_NOTIFY),
        )?
        .check()
        .context("cannot watch the X root window")?;
        let mut w = WindowWatch {
            conn,
            name,
            net_wm_name,
            mapped: HashSet::new(),
            found: false,
        };
        // Selected before the tree is read: a window mapped in between is
        // seen twice, never missed.
        let children = w.conn.query_tree(root)?.reply()?.children;
        for child in children {
            let viewable = w
                .conn
                .get_window_attributes(child)?
                .reply()
                .is_ok_and(|a| a.map_state == MapState::VIEWABLE);
            if viewable {
                w.mapped_now(child)?;
            }
        }
        Ok(w)
    }

    /// Takes the events that have arrived; true once a mapped window's
    /// name has matched.
    pub fn ready(&mut self) -> Result<bool> {
        while !self.found {
            let Some(ev) = self
                .conn
                .poll_for_event()
                .context("the X connection watching for the launch's window failed")?
            else {
                break;
            };
            match ev {
                Event::MapNotify(e) => self.mapped_now(e.window)?,
                Event::UnmapNotify(e) => {
                    self.mapped.remove(&e.window);
                }
                Event::DestroyNotify(e) => {
                    self.mapped.remove(&e.window);
                }
                Event::PropertyNotify(e)
                    if self.mapped.contains(&e.window)
                        && (e.atom == self.net_wm_name
                            || e.atom == u32::from(AtomEnum::WM_NAME)) =>
                {
                    self.found |= self.matches(e.window);
                }
                // Errors for windows gone before we asked about them.
                _ => {}
            }
        }
        Ok(self.found)
    }

    /// Waits until the server sends something, `other` becomes readable
    /// (the launch's pidfd), or `deadline`.
    pub fn wait(&self, other: Option<BorrowedFd<'_>>, deadline: Instant) {
        let fds: Vec<BorrowedFd<'_>> = std::iter::once(self.conn.stream().as_fd())
            .chain(other)
            .collect();
        crate::os::wait_any_readable(&fds, deadline);
    }

    /// A window was mapped: its renames are followed from now on, then its
    /// name is read (after the selection, so a rename in between is seen).
    fn mapped_now(&mut self, w: Window) -> Result<()> {
        self.mapped.insert(w);
        // Not checked: the window may be gone already (an error event).
        self.conn.change_window_attributes(
            w,
            &ChangeWindowAttributesAux::new().event_mask(EventMask::PROPERTY_CHANGE),
        )?;
        self.found |= self.matches(w);
        Ok(())
    }

    fn matches(&self, w: Window) -> bool {
        [self.net_wm_name, AtomEnum::WM_NAME.into()]
            .into_iter()
            .any(|prop| {
                self.conn
                    .get_property(false, w, prop, AtomEnum::ANY, 0, 1024)
                    .ok()
                    .and_then(|c| c.reply().ok())
                    .is_some_and(|r| self.name.is_match(&String::from_utf8_lossy(&r.value)))
            })
    }
}
