//! A Kafka-protocol broker for tests: tansu, in memory.
//!
//! `TASKFENCE_KAFKA_BOOTSTRAP` when set (`scripts/test` starts tansu and
//! exports it); otherwise a tansu this test starts on a free loopback port and
//! stops on drop, also on panic.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{ChildProcess, free_port};

/// A running broker; [`bootstrap`](Self::bootstrap) is its `bootstrap.servers`.
#[derive(Debug)]
pub struct KafkaBroker {
    bootstrap: String,
    /// Our own tansu, held to be killed on drop; `None` for an outside broker.
    _tansu: Option<ChildProcess>,
}

impl KafkaBroker {
    /// `TASKFENCE_KAFKA_BOOTSTRAP`, or a tansu of this test's own (installed
    /// with its in-memory storage engine when missing: slow, once).
    pub fn start() -> KafkaBroker {
        if let Ok(bootstrap) = std::env::var("TASKFENCE_KAFKA_BOOTSTRAP") {
            return KafkaBroker {
                bootstrap,
                _tansu: None,
            };
        }
        let tansu = tansu_binary();
        match KafkaBroker::spawn(&tansu) {
            Ok(broker) => broker,
            Err(log) if log.contains("FeatureNotEnabled") => {
                // A tansu built without the in-memory storage engine.
                install_tansu();
                KafkaBroker::spawn(&tansu).unwrap_or_else(|log| panic!("tansu did not start:\n{log}"))
            }
            Err(log) => panic!("tansu did not start:\n{log}"),
        }
    }

    /// `host:port` of the broker.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Starts tansu on a free loopback port; `Err(log)` if it exits before listening.
    fn spawn(tansu: &Path) -> Result<KafkaBroker, String> {
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log_path = std::env::temp_dir().join(format!("tansu-{port}.log"));
        let log = std::fs::File::create(&log_path).expect("tansu log file");
        // Owned by the guard from the start: a panic below still stops it.
        let mut child = ChildProcess::spawn(
            "tansu",
            Command::new(tansu)
                .args(["broker", "--storage-engine", "memory://tansu/"])
                .args(["--listener-url", &url, "--advertised-listener-url", &url])
                .stdout(Stdio::from(log.try_clone().expect("log")))
                .stderr(Stdio::from(log)),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.try_exit().is_some() {
                return Err(std::fs::read_to_string(&log_path).unwrap_or_default());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "tansu did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let broker = KafkaBroker {
            bootstrap: format!("127.0.0.1:{port}"),
            _tansu: Some(child),
        };
        eprintln!(
            "started tansu on {} (log {})",
            broker.bootstrap,
            log_path.display()
        );
        Ok(broker)
    }
}

/// `tansu` on PATH or in `~/.cargo/bin`, installed when missing.
fn tansu_binary() -> PathBuf {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("HOME or CARGO_HOME")
        .join("bin");
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([cargo_bin.clone()])
        .map(|dir| dir.join("tansu"))
        .find(|p| p.is_file());
    if let Some(path) = found {
        return path;
    }
    install_tansu();
    cargo_bin.join("tansu")
}

/// `cargo install tansu --locked --features dynostore`: the in-memory storage
/// engine is that cargo feature (a default install has no storage engine).
fn install_tansu() {
    eprintln!("installing tansu with its in-memory storage engine (15-35 minutes, once)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "install",
            "tansu",
            "--locked",
            "--features",
            "dynostore",
            "--force",
        ])
        .status()
        .expect("running cargo install");
    assert!(status.success(), "cargo install tansu failed");
}
