//! A private PostgreSQL cluster for one harness run (the chaos run, the
//! benchmark's sustained load): `initdb` into a temporary directory, started
//! with `pg_ctl` on a free loopback port with PostgreSQL's default settings
//! (autovacuum on), restarted on demand, stopped and deleted on drop.
//!
//! Why not the shared server on 127.0.0.1:5432? Restarting it would break
//! every other test running in parallel against it, and its settings are the
//! test machine's (this one runs with autovacuum off), not a production
//! server's. A private cluster runs the same PostgreSQL binaries, so a restart
//! is just as real, and it cannot make any other test flaky.
//!
//! When the harness runs as root (CI containers), the server commands run as
//! the `postgres` user through `runuser`: PostgreSQL refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::free_port;

/// Every setting a private cluster runs with that is not PostgreSQL's default
/// (besides its port and socket directory), for reports to state.
pub const NON_DEFAULT: [&str; 3] = [
    "-c listen_addresses=127.0.0.1",
    "-c max_connections=300",
    "-c log_min_messages=warning",
];

/// A running private cluster.
#[derive(Debug)]
pub struct PrivateServer {
    dir: PathBuf,
    port: u16,
    bindir: PathBuf,
    as_postgres: bool,
}

impl PrivateServer {
    /// Creates and starts a cluster (trust authentication, loopback only).
    ///
    /// # Panics
    ///
    /// When PostgreSQL's binaries are not installed or the server does not start.
    pub fn start() -> Self {
        let bindir = bindir();
        let as_postgres = is_root();
        stop_abandoned(&bindir, as_postgres);
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let dir = std::env::temp_dir().join(format!("taskfence-pg-{}", &unique[unique.len() - 12..]));
        let port = free_port();
        let server = Self {
            dir,
            port,
            bindir,
            as_postgres,
        };
        server.run(
            "initdb",
            &[
                "-D",
                path(&server.dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ],
        );
        let options = format!("{} -p {port} -k {}", NON_DEFAULT.join(" "), path(&server.dir));
        let log = server.dir.join("server.log");
        server.run(
            "pg_ctl",
            &[
                "-D",
                path(&server.dir),
                "-o",
                &options,
                "-l",
                path(&log),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        // Who owns the cluster: a later run stops it if this process died without doing so.
        let _ = std::fs::write(server.dir.join(OWNER_FILE), std::process::id().to_string());
        server
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts the server in `immediate` mode: every backend is killed at
    /// once without a checkpoint, like a crash, and the server replays its WAL
    /// on start. Blocks until it accepts connections again.
    pub fn restart(&self) {
        // `-l` again: without it the new server would write to (and hold open)
        // our stdout pipe.
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                path(&self.dir),
                "-l",
                path(&log),
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
                "restart",
            ],
        );
    }

    /// `program` from the server binaries, as the `postgres` user when we are root.
    fn command(&self, program: &str) -> Command {
        let exe = self.bindir.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let exe = self.bindir.join(program);
        // pg_ctl's server inherits these; keep the harness's stdout clean.
        let out = self
            .command(program)
            .args(args)
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let args = ["-D", path(&self.dir), "-m", "immediate", "-w", "stop"];
        let _ = self
            .command("pg_ctl")
            .args(args)
            .current_dir(std::env::temp_dir())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The file in a cluster's directory naming the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// Stops and deletes the clusters of earlier runs whose owner is gone
/// (killed with SIGKILL, so its `Drop` never ran).
fn stop_abandoned(bindir: &Path, as_postgres: bool) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        let is_ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("taskfence-pg-"));
        let Ok(owner) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        if is_ours && !Path::new("/proc").join(owner.trim()).exists() {
            // Dropping it stops the server and deletes the directory.
            drop(PrivateServer {
                dir,
                port: 0,
                bindir: bindir.to_path_buf(),
                as_postgres,
            });
        }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// `pg_config --bindir`, or the newest `/usr/lib/postgresql/<v>/bin`.
fn bindir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .filter(|d| d.join("initdb").exists())
        .expect("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
