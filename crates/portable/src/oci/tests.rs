use super::*;

#[test]
fn references() {
    let d = format!("sha256:{}", "a".repeat(64));
    // (input, registry, repository, tag, digest)
    let cases = [
        (
            "localhost:5000/plans/gimp:2.10",
            "localhost:5000",
            "plans/gimp",
            Some("2.10"),
            None,
        ),
        ("ghcr.io/acme/plans", "ghcr.io", "acme/plans", None, None),
        ("alpine", "docker.io", "library/alpine", None, None),
        (
            "127.0.0.1:5000/p@D",
            "127.0.0.1:5000",
            "p",
            None,
            Some(d.as_str()),
        ),
        (
            "reg.example/p:t@D",
            "reg.example",
            "p",
            Some("t"),
            Some(d.as_str()),
        ),
    ];
    for (s, reg, repo, tag, dig) in cases {
        let s = s.replace('D', &d);
        let r = Reference::parse(&s).unwrap();
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.tag.as_deref(),
                r.digest.as_deref()
            ),
            (reg, repo, tag, dig),
            "{s}"
        );
    }
    for bad in [
        "reg.example/Upper",
        "r.io/p@sha256:abc",
        "r.io/p@md5:00",
        "r.io/p:bad tag",
        "r.io//p",
    ] {
        assert!(Reference::parse(bad).is_err(), "{bad}");
    }
    assert!(Reference::parse("localhost:5000/p").unwrap().loopback());
    assert!(!Reference::parse("ghcr.io/p").unwrap().loopback());
}

#[test]
fn challenges() {
    assert_eq!(
        parse_challenge("Basic realm=\"Registry\""),
        Some(Challenge::Basic)
    );
    assert_eq!(
        parse_challenge(
            "Bearer realm=\"https://auth.docker.io/token\",service=\"registry.docker.io\",scope=\"repository:library/alpine:pull\""
        ),
        Some(Challenge::Bearer {
            realm: "https://auth.docker.io/token".into(),
            service: Some("registry.docker.io".into()),
            scope: Some("repository:library/alpine:pull".into()),
        })
    );
    assert_eq!(parse_challenge("Negotiate x"), None);
    assert_eq!(
        parse_challenge("Bearer service=\"x\""),
        None,
        "a realm is needed"
    );
}

#[test]
fn credentials_from_files_in_order_and_by_longest_key() {
    let d = tempfile::tempdir().unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let podman = d.path().join("auth.json");
    let docker = d.path().join("config.json");
    std::fs::write(
        &podman,
        format!(
            r#"{{"auths":{{"reg.example":{{"auth":"{}"}},"reg.example/team":{{"auth":"{}"}}}}}}"#,
            b64("all:1"),
            b64("team:2")
        ),
    )
    .unwrap();
    std::fs::write(
        &docker,
        format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}},"reg.example":{{"auth":"{}"}}}},"credsStore":"x"}}"#,
            b64("hub:3"),
            b64("docker:4")
        ),
    )
    .unwrap();
    let files = [d.path().join("absent.json"), podman.clone(), docker.clone()];
    let who = |r: &str| {
        credentials(&Reference::parse(r).unwrap(), &files)
            .unwrap()
            .map(|c| (c.user, c.password, c.source))
    };
    assert_eq!(
        who("reg.example/team/app"),
        Some(("team".into(), "2".into(), podman.clone()))
    );
    assert_eq!(
        who("reg.example/teamx/app"),
        Some(("all".into(), "1".into(), podman.clone()))
    );
    assert_eq!(
        who("alpine"),
        Some(("hub".into(), "3".into(), docker.clone()))
    );
    assert_eq!(who("other.example/p"), None);
    std::fs::write(&podman, r#"{"auths":{"reg.example":{"auth":"!!"}}}"#).unwrap();
    let e = credentials(&Reference::parse("reg.example/p").unwrap(), &files).unwrap_err();
    assert!(e.to_string().contains("auth.json"), "{e}");
}

/// A registry that wants a Bearer token, served from a plain socket:
/// the manifest and blob answer 401 with a challenge unless the
/// request carries the token its endpoint hands out for the right
/// Basic credentials. Returns its address and the requests it saw.
fn bearer_registry(
    manifest: Vec<u8>,
    blob: Vec<u8>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen2, addr2) = (seen.clone(), addr.clone());
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if r.read_line(&mut line).is_err() {
                continue;
            }
            let mut auth = String::new();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h
                    .strip_prefix("Authorization: ")
                    .or(h.strip_prefix("authorization: "))
                {
                    auth = v.trim().to_string();
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            seen2.lock().unwrap().push(format!("{path} {auth}"));
            let ok = auth == "Bearer t0ken";
            let (status, extra, body): (&str, String, Vec<u8>) = if path.starts_with("/token") {
                // "ci:pw" in base64.
                if auth == "Basic Y2k6cHc=" && path.contains("scope=repository%3Ateam%2Fapp%3Apull")
                {
                    ("200 OK", String::new(), br#"{"token":"t0ken"}"#.to_vec())
                } else {
                    ("401 Unauthorized", String::new(), Vec::new())
                }
            } else if !ok {
                let ch = format!(
                    "WWW-Authenticate: Bearer realm=\"http://{addr2}/token\",service=\"test\",scope=\"repository:team/app:pull\"\r\n"
                );
                (
                    "401 Unauthorized",
                    ch,
                    br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                        .to_vec(),
                )
            } else if path.contains("/manifests/") {
                (
                    "200 OK",
                    format!("Content-Type: {MANIFEST_TYPE}\r\n"),
                    manifest.clone(),
                )
            } else {
                ("200 OK", String::new(), blob.clone())
            };
            let mut c = conn;
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = c.write_all(&body);
        }
    });
    (addr, seen)
}

#[test]
fn pull_through_the_bearer_token_flow_with_basic_credentials() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("f");
    std::fs::write(&f, vec![3u8; 5000]).unwrap();
    let m = std::fs::metadata(&f).unwrap();
    use std::os::unix::fs::MetadataExt;
    let plan = warmstart_plan::Plan {
        meta: warmstart_plan::plan::PlanMeta {
            command: vec!["app".into()],
            created_unix_ms: 0,
            traces: 1,
            min_traces: 1,
            passes: vec![],
            sorted: false,
        },
        files: vec![warmstart_plan::plan::PlanFile {
            path: f.display().to_string(),
            id: warmstart_plan::trace::FileId {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            },
        }],
        lookups: vec![],
        entries: vec![warmstart_plan::Entry::Data {
            file: 0,
            offset: 0,
            len: 4096,
        }],
    };
    let (pp, _) = crate::format::export("app", &plan).unwrap();
    let blob = pp.to_bytes();
    let manifest = serde_json::to_vec(&Manifest {
        schema_version: 2,
        media_type: MANIFEST_TYPE.into(),
        artifact_type: Some(ARTIFACT_TYPE.into()),
        config: Descriptor {
            media_type: EMPTY_TYPE.into(),
            digest: sha256_digest(EMPTY),
            size: 2,
        },
        layers: vec![Descriptor {
            media_type: LAYER_TYPE.into(),
            digest: sha256_digest(&blob),
            size: blob.len() as u64,
        }],
        annotations: None,
    })
    .unwrap();
    let (addr, seen) = bearer_registry(manifest.clone(), blob);
    let r = Reference::parse(&format!("{addr}/team/app@{}", sha256_digest(&manifest))).unwrap();
    let mut c = Client::new(r.clone(), Duration::from_secs(5), false).unwrap();
    // No credentials: the token endpoint refuses, and the error says so.
    c.creds = None;
    let e = c.pull().unwrap_err().to_string();
    assert!(e.contains("token from"), "{e}");
    let mut c = Client::new(r, Duration::from_secs(5), false).unwrap();
    c.creds = Some(Credentials {
        user: "ci".into(),
        password: "pw".into(),
        source: "test".into(),
    });
    let (got, digest) = c.pull().unwrap();
    assert_eq!(got, pp);
    assert_eq!(digest, sha256_digest(&manifest));
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter()
            .any(|s| s.starts_with("/token") && s.ends_with("Basic Y2k6cHc=")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|s| s.contains("/blobs/") && s.ends_with("Bearer t0ken")),
        "{seen:?}"
    );
}

#[test]
fn a_registry_that_is_down_is_a_clear_error_not_a_hang() {
    // A port nothing listens on: connection refused, quickly.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let r = Reference::parse(&format!("127.0.0.1:{port}/p:t")).unwrap();
    let mut c = Client::new(r, Duration::from_secs(2), false).unwrap();
    let e = c.pull().unwrap_err().to_string();
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    // One that accepts and never answers: the timeout ends it.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let r = Reference::parse(&format!("127.0.0.1:{port}/p:t")).unwrap();
    let mut c = Client::new(r, Duration::from_millis(500), false).unwrap();
    let e = c.pull().unwrap_err().to_string();
    assert!(
        e.contains("timed out") || e.contains("Timed out") || e.contains("timeout"),
        "{e}"
    );
    drop(l);
}

#[test]
fn program_keys_follow_content_and_arguments_not_paths() {
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("a");
    let b = d.path().join("b");
    std::fs::write(&a, b"\x7fELF program").unwrap();
    std::fs::write(&b, b"\x7fELF program").unwrap();
    let l = d.path().join("l");
    std::os::unix::fs::symlink(&a, &l).unwrap();
    let k = |p: &Path, args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        program_key(p, &args).unwrap()
    };
    let ka = k(&a, &["x"]);
    assert!(ka.starts_with("sha256-") && ka.len() == 71, "{ka}");
    assert_eq!(k(&b, &["x"]), ka, "same bytes elsewhere");
    assert_eq!(k(&l, &["x"]), ka, "through a symlink");
    assert_ne!(k(&a, &["y"]), ka);
    assert_ne!(k(&a, &["x", ""]), ka);
    std::fs::write(&b, b"\x7fELF programs").unwrap();
    assert_ne!(k(&b, &["x"]), ka);
    // A valid tag.
    assert!(Reference::parse(&format!("r.io/p:{ka}")).is_ok());
}
