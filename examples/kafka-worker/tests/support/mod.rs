//! Shared by the end-to-end tests: a real Kafka-protocol broker (tansu) and
//! small waiting helpers.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// A broker to test against: `TASKFENCE_KAFKA_BOOTSTRAP` when set (the
/// README's test command starts tansu and exports it), else a tansu this test
/// starts on a free loopback port and stops on drop, also on panic.
pub struct Broker {
    pub bootstrap: String,
    child: Option<Child>,
}

impl Broker {
    pub fn start() -> Broker {
        if let Ok(bootstrap) = std::env::var("TASKFENCE_KAFKA_BOOTSTRAP") {
            return Broker {
                bootstrap,
                child: None,
            };
        }
        let tansu = tansu_binary();
        match Broker::spawn(&tansu) {
            Ok(broker) => broker,
            Err(log) if log.contains("FeatureNotEnabled") => {
                // A tansu built without the in-memory storage engine.
                install_tansu();
                Broker::spawn(&tansu).unwrap_or_else(|log| panic!("tansu did not start:\n{log}"))
            }
            Err(log) => panic!("tansu did not start:\n{log}"),
        }
    }

    /// Starts tansu on a free loopback port; `Err(log)` if it exits before listening.
    fn spawn(tansu: &Path) -> Result<Broker, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log_path = std::env::temp_dir().join(format!("tansu-{port}.log"));
        let log = std::fs::File::create(&log_path).expect("tansu log file");
        let child = Command::new(tansu)
            .args(["broker", "--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &url, "--advertised-listener-url", &url])
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", tansu.display()));
        let mut broker = Broker {
            bootstrap: format!("127.0.0.1:{port}"),
            child: Some(child),
        };
        let mut exited = false;
        wait_for("tansu to listen", Duration::from_secs(60), || {
            exited = broker
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if exited {
            return Err(std::fs::read_to_string(&log_path).unwrap_or_default());
        }
        eprintln!(
            "started tansu on {} (log {})",
            broker.bootstrap,
            log_path.display()
        );
        Ok(broker)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
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

/// Polls `condition` every 100 ms until it holds; panics after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !condition() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// The async twin of [`wait_for`].
pub async fn wait_until(what: &str, limit: Duration, mut condition: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !condition().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

/// Reads a group's committed offsets and the partitions' end offsets, without
/// joining the group.
pub struct GroupProbe {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl GroupProbe {
    pub fn new(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Self {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("probe consumer");
        Self {
            consumer,
            topic: topic.to_owned(),
            partitions,
        }
    }

    /// `(committed, end)` per partition; `committed` is `None` before any commit.
    pub fn positions(&self) -> Vec<(Option<i64>, i64)> {
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        (0..self.partitions)
            .map(|p| {
                let c = match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                };
                let (_low, high) = self
                    .consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                    .expect("watermarks");
                (c, high)
            })
            .collect()
    }
}
