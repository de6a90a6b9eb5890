//! `--ready window:NAME` on a real X server (Xvfb, which `make test`
//! installs): the watch sees a window when it is mapped with the name, or
//! renamed to it while mapped, and not before; a launch is complete at
//! its window's map, and one that exits without a window fails.
//!
//! The X client is this test binary itself, run again as a launch's
//! command with `WS_X_CLIENT` saying what it does.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use warmstart_bench::launch::{launch, Ready, Target};
use warmstart_bench::suite::Xvfb;
use warmstart_bench::window::WindowWatch;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    AtomEnum, ConnectionExt as _, CreateWindowAux, PropMode, Window, WindowClass,
};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;
use x11rb::COPY_DEPTH_FROM_PARENT;

const NAME: &str = "Letter - warmstart window test";

/// An unmapped top-level window called `name`.
fn window(conn: &RustConnection, screen: usize, name: &str) -> Window {
    let root = conn.setup().roots[screen].root;
    let w = conn.generate_id().unwrap();
    conn.create_window(
        COPY_DEPTH_FROM_PARENT,
        w,
        root,
        0,
        0,
        200,
        100,
        0,
        WindowClass::INPUT_OUTPUT,
        0,
        &CreateWindowAux::new(),
    )
    .unwrap();
    rename(conn, w, name);
    w
}

fn rename(conn: &RustConnection, w: Window, name: &str) {
    conn.change_property8(
        PropMode::REPLACE,
        w,
        AtomEnum::WM_NAME,
        AtomEnum::STRING,
        name.as_bytes(),
    )
    .unwrap();
    conn.flush().unwrap();
}

/// Waits up to `within` for the watch to say the window is up.
fn up_within(watch: &mut WindowWatch, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if watch.ready().unwrap() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        watch.wait(None, deadline);
    }
}

/// One server at a time: two starting at once would pick the same display.
static SERIAL: Mutex<()> = Mutex::new(());

fn xvfb() -> (MutexGuard<'static, ()>, Xvfb) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x = Xvfb::start().expect("Xvfb is needed (make test installs the xvfb package)");
    (serial, x)
}

#[test]
fn a_window_counts_once_mapped_with_the_name() {
    let (_serial, x) = xvfb();
    let mut watch = WindowWatch::start(Some(&x.display), "warmstart window test").unwrap();
    let (conn, screen) = x11rb::connect(Some(&x.display)).unwrap();

    // Another window mapped, and ours created with the name: neither is it.
    let other = window(&conn, screen, "something else");
    conn.map_window(other).unwrap();
    let w = window(&conn, screen, NAME);
    conn.flush().unwrap();
    assert!(!up_within(&mut watch, Duration::from_millis(300)));

    conn.map_window(w).unwrap();
    conn.flush().unwrap();
    assert!(up_within(&mut watch, Duration::from_secs(5)));
}

#[test]
fn a_mapped_window_renamed_to_the_name_counts() {
    let (_serial, x) = xvfb();
    let mut watch = WindowWatch::start(Some(&x.display), "WARMSTART window").unwrap();
    let (conn, screen) = x11rb::connect(Some(&x.display)).unwrap();
    let w = window(&conn, screen, "untitled");
    conn.map_window(w).unwrap();
    conn.flush().unwrap();
    assert!(!up_within(&mut watch, Duration::from_millis(300)));

    // Matched case-insensitively, as xdotool's --name does.
    rename(&conn, w, NAME);
    assert!(up_within(&mut watch, Duration::from_secs(5)));
}

#[test]
fn a_window_up_before_the_watch_counts() {
    let (_serial, x) = xvfb();
    let (conn, screen) = x11rb::connect(Some(&x.display)).unwrap();
    let w = window(&conn, screen, NAME);
    conn.map_window(w).unwrap();
    conn.flush().unwrap();
    // The map is done once the server has answered a request after it.
    conn.get_input_focus().unwrap().reply().unwrap();
    let mut watch = WindowWatch::start(Some(&x.display), "window test").unwrap();
    assert!(watch.ready().unwrap());
}

#[test]
fn no_display_is_a_clear_error() {
    let e = WindowWatch::start(Some(":199"), "x").err().unwrap();
    assert!(
        format!("{e:#}").contains("cannot connect to the X display \":199\""),
        "{e:#}"
    );
}

fn target(display: &str, what: &str) -> Target {
    let me = std::env::current_exe().unwrap();
    Target {
        name: "x-client".into(),
        argv: vec![
            me.to_string_lossy().into_owned(),
            "--exact".into(),
            "x_client".into(),
            "--include-ignored".into(),
            "--nocapture".into(),
        ],
        cwd: None,
        env: vec![
            ("DISPLAY".into(), display.into()),
            ("WS_X_CLIENT".into(), what.into()),
        ],
        ready: Ready::Window("window test".into()),
        prepare: None,
        cleanup: None,
        timeout: Duration::from_secs(20),
    }
}

#[test]
fn a_launch_is_complete_at_its_window() {
    let (_serial, x) = xvfb();
    let t0 = Instant::now();
    let l = launch(&target(&x.display, "map-after-400ms"), t0).unwrap();
    assert!(
        l.time >= Duration::from_millis(400) && l.time < Duration::from_secs(10),
        "{:?}",
        l.time
    );
    assert_eq!(l.exit_code, None, "stopped once ready, not exited");
}

#[test]
fn a_launch_that_exits_without_its_window_fails() {
    let (_serial, x) = xvfb();
    let e = launch(&target(&x.display, "exit"), Instant::now())
        .err()
        .unwrap();
    assert!(
        format!("{e:#}").contains("exited") && format!("{e:#}").contains("before it was ready"),
        "{e:#}"
    );
}

/// The launches' X client (does nothing when run as a test).
#[test]
#[ignore = "the X client the launch tests run"]
fn x_client() {
    let Ok(what) = std::env::var("WS_X_CLIENT") else {
        return;
    };
    if what == "exit" {
        return;
    }
    let (conn, screen) = x11rb::connect(None).unwrap();
    let w = window(&conn, screen, NAME);
    std::thread::sleep(Duration::from_millis(400));
    conn.map_window(w).unwrap();
    conn.flush().unwrap();
    std::thread::sleep(Duration::from_secs(30));
}
