//! Shared by every test: a fresh database (taskfence schema + app schema, both
//! dropped afterwards), the service on an ephemeral loopback port, and a real
//! HTTP client.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chat_api::sim::SimulatedLlm;
use chat_api::{Config, Mode, ReplyProvider, Service};
use reqwest::header::HeaderMap;
use serde_json::Value;
use sqlx::PgPool;
use taskfence::testing::{PgFixture, TempSchema};
use taskfence_test_support::row_count;

pub(crate) const ALICE: &str = "alice-token";
pub(crate) const BOB: &str = "bob-token";

/// How long the test provider takes per call.
pub(crate) const PROVIDER_LATENCY: Duration = Duration::from_millis(20);

/// A fresh taskfence schema (PgFixture) and an app schema next to it, each
/// dropped with this value.
pub(crate) struct TestDb {
    pub fixture: PgFixture,
    /// Created and migrated by the first service started on it.
    pub app_schema: TempSchema,
}

impl TestDb {
    pub(crate) async fn new() -> Self {
        let fixture = taskfence_test_support::fixture().await;
        let app_schema = TempSchema::new(fixture.url(), "chat_api_test_").await;
        Self { fixture, app_schema }
    }

    /// A pool whose connections put the app's tables in this test's schema:
    /// the same `connect_pool` the binary uses.
    pub(crate) async fn app_pool(&self) -> PgPool {
        let schema = Some(self.app_schema.name());
        taskfence::config::connect_pool(self.fixture.url(), schema, 24, "chat-api")
            .await
            .expect("connect the app pool")
    }

    /// Rows in an app table (`messages`, `reply_tasks`, `replies`) or a
    /// taskfence table (`tasks`, `attempts`, `handoffs`).
    pub(crate) async fn count(&self, table: &str) -> i64 {
        let pool = self.fixture.pg_store().pool();
        match table {
            "messages" | "reply_tasks" | "replies" => row_count(pool, self.app_schema.name(), table).await,
            _ => self.fixture.count(table).await,
        }
    }

    /// Every row count, to assert that a refused request wrote nothing.
    pub(crate) async fn counts(&self) -> [i64; 6] {
        let mut out = [0; 6];
        for (i, table) in [
            "messages",
            "reply_tasks",
            "replies",
            "tasks",
            "attempts",
            "handoffs",
        ]
        .into_iter()
        .enumerate()
        {
            out[i] = self.count(table).await;
        }
        out
    }
}

/// The config every test runs with: two users, a quick poll.
pub(crate) fn config(db: &TestDb, mode: Mode) -> Config {
    let tokens = HashMap::from([
        (ALICE.to_owned(), "alice".to_owned()),
        (BOB.to_owned(), "bob".to_owned()),
    ]);
    let mut config = Config::new(tokens);
    config.mode = mode;
    config.taskfence_schema = db.fixture.schema().to_owned();
    config.worker.poll_every = Duration::from_millis(100);
    config.listen = "127.0.0.1:0".parse().expect("an address");
    config
}

/// The service, started in-process on 127.0.0.1:0 (no listener for `WorkerOnly`).
pub(crate) struct TestService {
    service: Service,
    /// The service's pool (a handle on it), for [`TestService::crash`].
    pool: PgPool,
    pub api: Option<Api>,
}

impl TestService {
    pub(crate) async fn start(db: &TestDb, mode: Mode) -> Self {
        Self::start_with(db, config(db, mode)).await
    }

    pub(crate) async fn start_with(db: &TestDb, config: Config) -> Self {
        Self::start_with_provider(db, config, SimulatedLlm::new(PROVIDER_LATENCY)).await
    }

    pub(crate) async fn start_with_provider(
        db: &TestDb,
        config: Config,
        provider: impl ReplyProvider,
    ) -> Self {
        let provider: Arc<dyn ReplyProvider> = Arc::new(provider);
        let pool = db.app_pool().await;
        let service = Service::start(pool.clone(), config, provider)
            .await
            .expect("start the service");
        let api = service.local_addr().map(|addr| Api {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
        });
        Self { service, pool, api }
    }

    pub(crate) fn service(&self) -> &Service {
        &self.service
    }

    pub(crate) fn api(&self) -> &Api {
        self.api.as_ref().expect("this service runs the API")
    }

    pub(crate) async fn stop(self) {
        self.service.shutdown().await;
    }

    /// Stops the service as a crash looks to the database: its pool is
    /// closed first, so it can neither renew nor release its leases (they
    /// expire) nor save anything.
    pub(crate) async fn crash(self) {
        self.pool.close().await;
        self.service.shutdown().await;
    }
}

/// One HTTP response, read whole.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub(crate) fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an RFC 9457 problem of this status and type.
    pub(crate) fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status, status, "{}", String::from_utf8_lossy(&self.body));
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let body = self.json();
        assert_eq!(body["type"], format!("/problems/{slug}"), "{body}");
        assert_eq!(body["status"], status);
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
    }
}

/// A real HTTP client against the running service.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub base: String,
    pub client: reqwest::Client,
}

impl Api {
    pub(crate) async fn send(
        &self,
        token: &str,
        conversation: &str,
        key: Option<&str>,
        content: &str,
    ) -> Reply {
        let mut request = self
            .client
            .post(format!("{}/conversations/{conversation}/messages", self.base))
            .bearer_auth(token)
            .json(&serde_json::json!({ "content": content }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", format!("\"{key}\""));
        }
        read(request).await
    }

    pub(crate) async fn regenerate(&self, token: &str, message_id: &str, key: &str) -> Reply {
        let request = self
            .client
            .post(format!("{}/messages/{message_id}/regenerate", self.base))
            .bearer_auth(token)
            .header("Idempotency-Key", format!("\"{key}\""));
        read(request).await
    }

    pub(crate) async fn task(&self, token: &str, task_id: &str, wait: Option<&str>) -> Reply {
        let url = match wait {
            Some(wait) => format!("{}/tasks/{task_id}?wait={wait}", self.base),
            None => format!("{}/tasks/{task_id}", self.base),
        };
        read(self.client.get(url).bearer_auth(token)).await
    }

    /// Long-polls until the task has a saved reply (bounded: 30 s per call, 3 calls).
    pub(crate) async fn wait_for_reply(&self, token: &str, task_id: &str) -> Value {
        for _ in 0..3 {
            let reply = self.task(token, task_id, Some("30s")).await;
            assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
            let view = reply.json();
            if !view["reply"].is_null() {
                return view;
            }
        }
        panic!("task {task_id} has no reply after 90 s");
    }
}

pub(crate) async fn read(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.expect("the request reaches the service");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("read the body").to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// `task.id` and `message.id` of a Send or Regenerate response.
pub(crate) fn ids(reply: &Reply) -> (String, String) {
    let body = reply.json();
    (
        body["task"]["id"].as_str().expect("task.id").to_owned(),
        body["message"]["id"].as_str().expect("message.id").to_owned(),
    )
}
