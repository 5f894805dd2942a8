//! Shared helpers: a taskfence fixture (fresh schema, movable store clock) plus
//! the application's tables in a schema of their own, both dropped at the end.
#![allow(dead_code)] // each test binary uses a part

use std::time::Duration;

use document_indexing::{Indexed, Indexer, chunk};
use sqlx::{ConnectOptions, Connection};
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{Status, TaskId, TaskStore};

/// The lease every test worker takes.
pub const LEASE: Duration = Duration::from_secs(30);

/// One test's world: taskfence in the fixture's schema, the app in `<that>_app`.
pub struct Harness {
    pub fixture: PgFixture,
    pub indexer: Indexer,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with(|indexer| indexer).await
    }

    /// A harness whose indexer is configured by `configure` before migrating.
    pub async fn with(configure: impl FnOnce(Indexer) -> Indexer) -> Self {
        let fixture = PgFixture::new().await;
        let schema = format!("{}_app", fixture.schema());
        let indexer = configure(Indexer::new(fixture.pg_store().clone(), &schema).expect("a valid schema"));
        indexer.migrate().await.expect("create the app's tables");
        Self { fixture, indexer }
    }

    /// Moves the store clock forward (leases and retention expire without sleeping).
    pub async fn advance(&self, by: Duration) {
        self.fixture.advance(by).await;
    }

    /// Rows of one of the app's tables.
    pub async fn app_rows(&self, table: &str) -> i64 {
        assert!(matches!(
            table,
            "documents" | "document_versions" | "index_entries"
        ));
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\".{table}",
            self.indexer.schema()
        ))
        .fetch_one(self.indexer.store().pool())
        .await
        .expect("count rows")
    }

    /// Stored entries (visible or not) of one version.
    pub async fn stored_entries(&self, document: &str, version: i64) -> Vec<String> {
        sqlx::query_scalar(&format!(
            "SELECT body FROM \"{}\".index_entries WHERE document_id = $1 AND version = $2 ORDER BY chunk",
            self.indexer.schema()
        ))
        .bind(document)
        .bind(version)
        .fetch_all(self.indexer.store().pool())
        .await
        .expect("read entries")
    }

    /// The bodies readers see for a document, with the version each came from.
    pub async fn visible(&self, document: &str) -> Vec<(i64, String)> {
        self.indexer
            .visible_entries(document)
            .await
            .expect("read visible entries")
            .into_iter()
            .map(|e| (e.version, e.body))
            .collect()
    }

    pub async fn status(&self, task: TaskId) -> Status {
        self.indexer
            .store()
            .get(task)
            .await
            .expect("get")
            .expect("the task exists")
            .status
    }

    /// Uploads and indexes a version to completion, asserting it is done.
    pub async fn upload_and_index(&self, document: &str, version: i64, body: &str) -> Indexed {
        let task = self
            .indexer
            .upload(document, version, body)
            .await
            .expect("upload")
            .task;
        let outcome = self
            .indexer
            .index_once("worker-x", task.id, LEASE)
            .await
            .expect("index");
        assert!(matches!(outcome, Indexed::Done { .. }), "{outcome:?}");
        outcome
    }
}

/// `(version, chunk)` pairs readers should see when `body` of `version` is current.
pub fn expected_visible(version: i64, body: &str) -> Vec<(i64, String)> {
    chunk(body).into_iter().map(|c| (version, c)).collect()
}

impl Drop for Harness {
    /// Drops the app's schema (the fixture drops its own right after). Drop
    /// cannot await: a short-lived thread with its own runtime does it.
    fn drop(&mut self) {
        let (url, schema) = (self.fixture.url().to_owned(), self.indexer.schema().to_owned());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let options: sqlx::postgres::PgConnectOptions = url.parse().ok()?;
                let mut conn = options.disable_statement_logging().connect().await.ok()?;
                sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .execute(&mut conn)
                    .await
                    .ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}

pub const V1: &str = "Decision: ship in March.\n\nOwner: Ana.";
pub const V2: &str = "Decision: ship in April.\n\nOwner: Ben.\n\nRisk: supplier delay.";
