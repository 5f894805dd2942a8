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

/// The binary, started on `db` from environment variables only (plus
/// `extra`), logging at `info` into a pipe the test reads.
struct Running;

impl Running {
    /// The running binary (killed on drop), its log, and a client on the
    /// address it printed once started.
    fn start(db: &TestDb, extra: &[(&str, &str)]) -> (ChildProcess, Logs, Api) {
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
            .envs(extra.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr_writer);
        // Killed on drop, so a failed assertion does not leave the binary running.
        let child = ChildProcess::spawn("chat-api", &mut command);
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
        (child, logs, api)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_from_environment_variables_and_stops_on_sigterm() {
    let db = TestDb::new().await;
    let (mut child, logs, api) = Running::start(&db, &[]);

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

/// What an OTLP/HTTP collector received: every span of every export request.
#[derive(Clone, Default)]
struct Collector(std::sync::Arc<std::sync::Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>);

impl Collector {
    /// Serves `POST /v1/traces` on a free loopback port; returns its base URL.
    async fn start(&self) -> String {
        use axum::body::Bytes;
        use prost::Message as _;
        let spans = self.0.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| async move {
                let request =
                    opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(body)
                        .expect("an OTLP protobuf export request");
                let mut kept = spans.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        kept.extend(scope.spans);
                    }
                }
                axum::http::StatusCode::OK
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn spans(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        self.0.lock().unwrap().clone()
    }
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT`, a Send's trace reaches the collector
/// whole: the request's server span, the store's submit inside it, and the
/// worker's `process` span for the reply task as the request's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_one_trace_per_request_to_an_otlp_collector() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let db = TestDb::new().await;
    let (mut child, _logs, api) = Running::start(&db, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);
    let sent = api.send(ALICE, "conv-1", Some("send-1"), "Hello?").await;
    assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.body));
    let (task_id, _) = ids(&sent);
    api.wait_for_reply(ALICE, &task_id).await;

    // A stop exports what the batch still holds.
    child.signal("TERM");
    let status = child
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the binary exits");
    assert!(status.success(), "{status}");

    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let send = spans
        .iter()
        .find(|s| s.name == "POST /conversations/{conversation_id}/messages")
        .unwrap_or_else(|| panic!("the request's span in {names:?}"));
    let in_trace: Vec<_> = spans.iter().filter(|s| s.trace_id == send.trace_id).collect();
    let string_attr = |span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| match &kv.value {
                Some(v) => match &v.value {
                    Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => {
                        Some(s.clone())
                    }
                    _ => None,
                },
                None => None,
            })
    };
    let submit = in_trace
        .iter()
        .find(|s| string_attr(s, "op").as_deref() == Some("submit"))
        .unwrap_or_else(|| panic!("the store's submit in the request's trace: {names:?}"));
    assert_eq!(
        submit.parent_span_id, send.span_id,
        "submitted inside the request"
    );
    let process = in_trace
        .iter()
        .find(|s| s.name == "process chat.reply")
        .unwrap_or_else(|| panic!("the worker's span in the request's trace: {names:?}"));
    assert_eq!(
        process.parent_span_id, send.span_id,
        "the worker's span is the request's child"
    );
    assert_eq!(
        string_attr(process, "messaging.message.id").as_deref(),
        Some(task_id.as_str())
    );
    assert_eq!(
        process.status.as_ref().map(|s| s.code),
        Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Ok as i32),
        "the reply was saved"
    );
}
