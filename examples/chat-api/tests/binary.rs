//! The `chat-api` binary as a deployment runs it: configured only by
//! environment variables, logging through `RUST_LOG`, serving real HTTP, and
//! stopping cleanly on SIGTERM.

mod support;

use std::io::{BufRead, BufReader, PipeReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::{ALICE, Api, TestDb, ids};
use taskfence_test_support::ChildProcess;

/// The binary's stderr, line by line, as it is written.
struct Logs(mpsc::Receiver<String>);

impl Logs {
    fn follow(stderr: PipeReader) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self(rx)
    }

    /// The first line containing `needle`, waiting at most `within`.
    fn wait_for(&self, needle: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.0.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?} within {within:?} ({e})"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_from_environment_variables_and_stops_on_sigterm() {
    let db = TestDb::new().await;
    let (stderr, stderr_writer) = std::io::pipe().expect("a pipe for the binary's stderr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_chat-api"));
    command
        .env_clear()
        .env("DATABASE_URL", db.fixture.url())
        .env("TASKFENCE_LISTEN", "127.0.0.1:0")
        .env("TASKFENCE_SCHEMA", db.fixture.schema())
        .env("CHAT_API_SCHEMA", db.app_schema.name())
        .env("CHAT_API_TOKENS", format!("{ALICE}=alice"))
        .env("CHAT_API_POLL_EVERY", "100ms")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr_writer);
    // Killed on drop, so a failed assertion does not leave the binary running.
    let mut child = ChildProcess::spawn("chat-api", &mut command);
    // The command holds the pipe's write end: the reader sees EOF only once it is gone.
    drop(command);
    let logs = Logs::follow(stderr);

    // `RUST_LOG=info` shows the start-up line, with the port the OS chose.
    let started = logs.wait_for("chat-api started", Duration::from_secs(60));
    let addr = started
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr in {started:?}"))
        .to_owned();
    let api = Api {
        base: format!("http://{addr}"),
        client: reqwest::Client::new(),
    };

    // The readiness probe needs no token.
    let health = support::read(api.client.get(format!("{}/healthz", api.base))).await;
    assert_eq!(
        (health.status, health.json()["status"].as_str()),
        (200, Some("ok"))
    );

    let sent = api.send(ALICE, "conv-1", Some("send-1"), "Hello?").await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.body));
    let (task_id, _) = ids(&sent);
    let view = api.wait_for_reply(ALICE, &task_id).await;
    assert_eq!(view["reply"]["content"], "Reply to: Hello? (attempt 1)");
    assert_eq!(db.count("replies").await, 1, "written in CHAT_API_SCHEMA");

    child.signal("TERM");
    logs.wait_for("shutting down", Duration::from_secs(10));
    let status = child
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the binary exits after SIGTERM");
    assert!(status.success(), "a SIGTERM stop is a clean exit: {status}");
}

#[test]
fn the_binary_refuses_to_start_without_its_required_settings() {
    let out = Command::new(env!("CARGO_BIN_EXE_chat-api"))
        .env_clear()
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--database-url") && stderr.contains("DATABASE_URL"),
        "{stderr}"
    );
}
