//! A replay pacing its data behind a gate ([`DataGate`]): while the gate
//! is closed each data request is read through, synchronously; once it
//! is open, or past its limit, requests are queued with `WILLNEED` as
//! usual. Metadata and lookups are issued the same either way.

use std::sync::Arc;
use std::time::Duration;

use warmstart_plan::trace::NsOpKind;
use warmstart_plan::{Entry, Plan};
use warmstart_replay::mock::{Call, MockBackend};
use warmstart_replay::{DataGate, Engine};

mod common;
use common::*;

fn gated_plan(dev: u64) -> Plan {
    plan(
        &[("/app", id(1))],
        &[(NsOpKind::Exec, "/app")],
        vec![
            Entry::Meta {
                device: dev,
                offset: 0,
                len: 4 * K,
            },
            Entry::Lookup { index: 0 },
            data(0, 0, 4 * K),
            data(0, 4 * K, 4 * K),
        ],
    )
}

fn read(target: &str, offset: u64, len: u64) -> Call {
    Call::Read {
        target: target.into(),
        offset,
        len,
    }
}

#[test]
fn data_is_read_through_while_the_gate_is_closed() {
    let dev = libc::makedev(8, 1);
    let b = MockBackend::new().with_file("/app", id(1)).with_device(dev);
    let gate = Arc::new(DataGate::closed(Duration::from_secs(60)));
    let r = Engine::new(&b, opts(1))
        .unwrap()
        .pace_data(gate)
        .run(&gated_plan(dev))
        .unwrap();
    assert_eq!(
        io_calls(&b),
        vec![
            Call::OpenDevice(dev),
            prefetch("dev:8:1", 0, 4 * K),
            Call::Lookup(NsOpKind::Exec, "/app".into()),
            Call::OpenFile("/app".into()),
            read("/app", 0, 4 * K),
            read("/app", 4 * K, 4 * K),
        ]
    );
    // Counted as the requests they are.
    assert_eq!(r.data.entries, 2);
    assert_eq!(r.data.bytes, 8 * K);
    assert_eq!(r.entries_issued, r.entries_total);
}

#[test]
fn an_open_gate_or_one_past_its_limit_queues_the_data() {
    let dev = libc::makedev(8, 1);
    let opened = Arc::new(DataGate::closed(Duration::from_secs(60)));
    opened.open();
    let expired = Arc::new(DataGate::closed(Duration::ZERO));
    for gate in [opened, expired] {
        let b = MockBackend::new().with_file("/app", id(1)).with_device(dev);
        Engine::new(&b, opts(1))
            .unwrap()
            .pace_data(gate)
            .run(&gated_plan(dev))
            .unwrap();
        let calls = io_calls(&b);
        assert!(calls.contains(&prefetch("/app", 0, 4 * K)), "{calls:?}");
        assert!(calls.contains(&prefetch("/app", 4 * K, 4 * K)), "{calls:?}");
        assert!(!calls.iter().any(|c| matches!(c, Call::Read { .. })));
    }
}
