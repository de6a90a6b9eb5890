//! A real OCI registry for the tests that push and pull: Debian's
//! `docker-registry` (the CNCF distribution registry) on a free loopback
//! port, with temporary storage, stopped when the test ends.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;

pub const REGISTRY: &str = "/usr/bin/docker-registry";

/// A registry process, killed and reaped on drop.
pub struct Registry {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// With `htpasswd` (user, password): Basic authentication required.
    pub fn start(htpasswd: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let auth = match htpasswd {
            Some((user, password)) => {
                // The registry takes bcrypt hashes; glibc's crypt makes them.
                let out = run_ok(Command::new("python3").args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt, sys; print(crypt.crypt(sys.argv[1], '$2b$05$abcdefghijklmnopqrstuu'))",
                    password,
                ]));
                let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
                assert!(hash.starts_with("$2b$"), "{hash}");
                let file = dir.path().join("htpasswd");
                std::fs::write(&file, format!("{user}:{hash}\n")).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n{auth}",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting docker-registry");
        let reg = Registry {
            child,
            addr,
            _dir: dir,
        };
        // Ready when it accepts connections (it binds after loading).
        wait_for("docker-registry to start", Duration::from_secs(20), || {
            std::net::TcpStream::connect(&reg.addr).is_ok()
        });
        reg
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
