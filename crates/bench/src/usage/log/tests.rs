//! Tests of [`super`].

use super::*;

#[test]
fn parses_a_log_with_comments_and_blank_lines() {
    let boots = parse(
        "# two boots\n{\"step\":\"boot\"}\n\n\
         {\"step\":\"launch\",\"after_ms\":2000,\"program\":\"a\"}\n\
         {\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":5,\"program\":\"b\"}\n",
    )
    .unwrap();
    assert_eq!(boots.len(), 2);
    assert_eq!(boots[0].line, 2);
    assert_eq!(
        boots[0].launches,
        vec![LogLaunch {
            line: 4,
            after_ms: 2000,
            program: "a".into()
        }]
    );
    assert_eq!(boots[1].launches[0].line, 6);
    // And back.
    let again = parse(&encode(&to_steps(&boots))).unwrap();
    assert_eq!(again[1].launches[0].program, "b");
}

#[test]
fn errors_name_the_line() {
    for (text, want) in [
        ("{\"step\":\"boot\"}\n{\"step\":\"reboot\"}\n", "line 2:"),
        (
            "\n\n{\"step\":\"launch\",\"after_ms\":1,\"program\":\"a\"}\n",
            "line 3: a launch before",
        ),
        (
            "{\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":-1,\"program\":\"a\"}\n",
            "line 2:",
        ),
        (
            "{\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":1,\"program\":\"\"}\n",
            "line 2: a launch with an empty",
        ),
        ("not json\n", "line 1:"),
        ("# nothing\n", "no boot step"),
    ] {
        let e = format!("{:#}", parse(text).unwrap_err());
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn unknown_programs_are_named_with_their_line() {
    let boots =
        parse("{\"step\":\"boot\"}\n{\"step\":\"launch\",\"after_ms\":1,\"program\":\"gimp\"}\n")
            .unwrap();
    let known = vec!["clang".to_string()];
    let e = check_programs(&boots, &known).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("\"gimp\""), "{e}");
    assert!(check_programs(&boots, &["gimp".to_string()]).is_ok());
}

#[test]
fn train_split() {
    assert_eq!(default_train(6), 3);
    assert_eq!(default_train(5), 2);
    assert_eq!(default_train(1), 0);
    assert!(check_train(3, 6).is_ok());
    assert!(check_train(0, 1).is_ok());
    let e = check_train(2, 2).unwrap_err().to_string();
    assert!(e.contains("no boot to measure"), "{e}");
}

#[test]
fn the_default_log_is_short_and_uses_quick_suite_programs() {
    let boots = from_steps(&default_steps()).unwrap();
    assert_eq!(boots.len(), 8);
    // As its documentation says.
    assert_eq!(waits_ms(&boots) / 1000, 172);
    let suite = crate::suite::Suite::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/suite.toml"),
    )
    .unwrap();
    let known: Vec<String> = suite.programs.iter().map(|p| p.name.clone()).collect();
    check_programs(&boots, &known).unwrap();
    for b in &boots {
        // The login, then gedit and clang autostarted, then the routine.
        assert_eq!(b.markers[0].kind, MarkerKind::Login, "{b:?}");
        assert_eq!(b.markers[0].before, 0);
        assert!((2_000..=4_000).contains(&b.markers[0].after_ms));
        assert!((3..=6).contains(&b.launches.len()), "{b:?}");
        assert_eq!(b.launches[0].program, "gedit");
        assert_eq!(b.launches[1].program, "clang");
        let evicted: Vec<usize> = b.markers[1..].iter().map(|m| m.before).collect();
        for (n, l) in b.launches.iter().enumerate() {
            assert!(!["gimp", "libreoffice"].contains(&l.program.as_str()));
            let range = if n < 2 {
                300..=800
            } else if evicted.contains(&n) {
                10_000..=15_000
            } else {
                2_000..=6_000
            };
            assert!(range.contains(&l.after_ms), "{b:?}");
        }
    }
    let launches: usize = boots.iter().map(|b| b.launches.len()).sum();
    assert!((30..=46).contains(&launches), "{launches}");
    // Every program is measured, and launched twice while training.
    let has = |range: std::ops::Range<usize>, p: &str| {
        boots[range]
            .iter()
            .flat_map(|b| &b.launches)
            .any(|l| l.program == p)
    };
    let train = default_train(boots.len());
    for p in ["python-scipy", "javac", "npm", "clang", "gedit"] {
        assert!(has(train..boots.len(), p), "{p} is not measured");
        let trained = boots[..train]
            .iter()
            .flat_map(|b| &b.launches)
            .filter(|l| l.program == p)
            .count();
        assert!(
            trained >= 2,
            "{p} is launched {trained} times while training"
        );
    }
}

#[test]
fn a_history_becomes_a_log() {
    let text = "\
{\"event\":\"startup\",\"kind\":\"boot\",\"at_ms\":1000}
{\"event\":\"launch\",\"profile\":\"clang-u0-aa\",\"at_ms\":4000}
{\"event\":\"launch\",\"profile\":\"bash-u0-bb\",\"at_ms\":5000}
{\"event\":\"startup\",\"kind\":\"login\",\"at_ms\":6000,\"session\":3}
{\"event\":\"launch\",\"profile\":\"javac-u0-cc\",\"at_ms\":9000000}
{\"event\":\"startup\",\"kind\":\"boot\",\"at_ms\":9500000}
{\"event\":\"launch\",\"profile\":\"clang-u0-aa\",\"at_ms\":9502500}
";
    let map: BTreeMap<String, String> = [("clang-u0-aa", "clang"), ("javac-u0-cc", "javac")]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let (steps, unmapped) = from_history(text, &map, 60_000);
    let l = |after_ms, p: &str| Step::Launch {
        after_ms,
        program: p.into(),
    };
    assert_eq!(
        steps,
        vec![
            Step::Boot,
            l(3000, "clang"),
            // The gap since clang (the unmapped launch is not an
            // event of the log).
            Step::Login { after_ms: 2000 },
            // Capped.
            l(60_000, "javac"),
            Step::Boot,
            l(2500, "clang"),
        ]
    );
    assert_eq!(unmapped.get("bash-u0-bb"), Some(&1));
}

#[test]
fn profiles_are_matched_to_programs_by_command() {
    let d = tempfile::tempdir().unwrap();
    for (name, cmd) in [
        ("clang-u0-aa", vec!["/usr/bin/clang", "-c", "x.c"]),
        ("clang-u0-bb", vec!["/usr/bin/clang", "-c", "y.c"]),
    ] {
        let p = d.path().join("profiles").join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(
            p.join("profile.json"),
            serde_json::json!({ "name": name, "command": cmd }).to_string(),
        )
        .unwrap();
    }
    let programs = vec![(
        "clang".to_string(),
        vec!["clang".to_string(), "-c".into(), "x.c".into()],
    )];
    let m = profiles_by_command(d.path(), &programs);
    assert_eq!(m.len(), 1);
    assert_eq!(m["clang-u0-aa"], "clang");
}

#[test]
fn the_default_seed_is_the_first_that_meets_the_criterion() {
    let spec = default_spec();
    let meets = |seed| {
        let spec = UsageSpec {
            seed,
            ..default_spec()
        };
        let boots = from_steps(&generate(&spec)).unwrap();
        meets_default_criterion(&spec, &boots, default_train(boots.len()))
    };
    assert!(meets(spec.seed));
    let earlier: Vec<u64> = (0..spec.seed).filter(|s| meets(*s)).collect();
    assert!(earlier.is_empty(), "{earlier:?} meet it too");
}

#[test]
fn the_criterion_can_fail() {
    let spec = default_spec();
    let boots = from_steps(&default_steps()).unwrap();
    assert!(meets_default_criterion(&spec, &boots, 4));
    // Training on one boot launches nothing twice.
    assert!(!meets_default_criterion(&spec, &boots, 1));
    // Without the evictions, none is measured.
    let mut no_evict = boots.clone();
    for b in &mut no_evict {
        b.markers.retain(|m| m.kind != MarkerKind::Evict);
    }
    assert!(!meets_default_criterion(&spec, &no_evict, 4));
    // Two measured boots alike.
    let mut alike = boots.clone();
    alike[7].launches = alike[6].launches.clone();
    assert!(!meets_default_criterion(&spec, &alike, 4));
}

#[test]
fn parses_logins_and_evictions() {
    let text = "{\"step\":\"boot\"}\n{\"step\":\"login\",\"after_ms\":3000}\n\
         {\"step\":\"launch\",\"after_ms\":400,\"program\":\"a\"}\n\
         {\"step\":\"evict\",\"after_ms\":2000}\n\
         {\"step\":\"launch\",\"after_ms\":12000,\"program\":\"b\"}\n\
         {\"step\":\"evict\",\"after_ms\":5}\n";
    let boots = parse(text).unwrap();
    let m = |line, before, after_ms, kind| Marker {
        line,
        before,
        after_ms,
        kind,
    };
    assert_eq!(
        boots[0].markers,
        vec![
            m(2, 0, 3000, MarkerKind::Login),
            m(4, 1, 2000, MarkerKind::Evict),
            // After the last launch.
            m(6, 2, 5, MarkerKind::Evict),
        ]
    );
    assert_eq!(boots[0].launches.len(), 2);
    // Written back as read.
    assert_eq!(encode(&to_steps(&boots)), text);
    assert_eq!(waits_ms(&boots), 3000 + 400 + 2000 + 12_000 + 5);
    for (text, want) in [
        (
            "{\"step\":\"login\",\"after_ms\":1}\n",
            "line 1: a login before",
        ),
        (
            "{\"step\":\"boot\"}\n\n{\"step\":\"evict\"}\n",
            "line 3: not a usage-log step",
        ),
        (
            "# x\n{\"step\":\"evict\",\"after_ms\":1}\n",
            "line 2: an eviction before",
        ),
    ] {
        let e = format!("{:#}", parse(text).unwrap_err());
        assert!(e.contains(want), "{text:?}: {e}");
    }
}

#[test]
fn startup_sequences_and_launches_after_an_eviction() {
    let l = |after_ms| LogLaunch {
        line: 0,
        after_ms,
        program: "p".into(),
    };
    let m = |before, kind| Marker {
        line: 0,
        before,
        after_ms: 1,
        kind,
    };
    use MarkerKind::{Evict, Login};
    let boot = Boot {
        line: 0,
        // 0: before the login; 1, 2: the sequence (2000 is not longer
        // than the gap); 3: after 2001 ms, ends it; 4: after an
        // eviction; 5: the next; 6: a second login, but a long wait
        // first; 7, 8: a third login's sequence, cut by an eviction.
        launches: vec![
            l(100),
            l(500),
            l(2000),
            l(2001),
            l(12_000),
            l(300),
            l(3000),
            l(400),
            l(400),
        ],
        markers: vec![
            m(1, Login),
            m(4, Evict),
            m(6, Login),
            m(7, Login),
            m(8, Evict),
        ],
    };
    let kinds = launch_kinds(&boot, 2000);
    let seq: Vec<usize> = (0..9).filter(|&i| kinds[i].startup_sequence).collect();
    let evicted: Vec<usize> = (0..9).filter(|&i| kinds[i].after_eviction).collect();
    assert_eq!(seq, [1, 2, 7]);
    assert_eq!(evicted, [4, 8]);
    // A longer sequence gap keeps launch 3.
    let kinds = launch_kinds(&boot, 2500);
    assert!(kinds[3].startup_sequence && !kinds[4].startup_sequence);
    // The default log: every boot's sequence is its autostart burst.
    for b in from_steps(&default_steps()).unwrap() {
        let k = launch_kinds(&b, 2000);
        let seq: Vec<&str> = b
            .launches
            .iter()
            .zip(&k)
            .filter(|(_, k)| k.startup_sequence)
            .map(|(l, _)| l.program.as_str())
            .collect();
        assert_eq!(seq, ["gedit", "clang"], "{b:?}");
    }
}
