//! Shared helpers: a taskfence fixture (fresh schema, movable store clock) plus
//! the application's tables in a schema of their own, both dropped at the end.
#![allow(dead_code)] // each test binary uses a part

use std::time::Duration;

use document_indexing::{Indexed, Indexer, chunk};
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{Status, TaskId, TaskStore};
use taskfence_test_support::{TempSchema, row_count};

/// The lease every test worker takes.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// One test's world: taskfence in the fixture's schema, the app in a
/// [`TempSchema`] of its own. Each schema is dropped with the harness.
pub(crate) struct Harness {
    pub fixture: PgFixture,
    pub indexer: Indexer,
    pub app_schema: TempSchema,
}

impl Harness {
    pub(crate) async fn new() -> Self {
        Self::with(|indexer| indexer).await
    }

    /// A harness whose indexer is configured by `configure` before migrating.
    pub(crate) async fn with(configure: impl FnOnce(Indexer) -> Indexer) -> Self {
        let fixture = taskfence_test_support::fixture().await;
        let app_schema = TempSchema::new(fixture.url(), "docidx_test_").await;
        let indexer =
            configure(Indexer::new(fixture.pg_store().clone(), app_schema.name()).expect("a valid schema"));
        indexer.migrate().await.expect("create the app's tables");
        Self {
            fixture,
            indexer,
            app_schema,
        }
    }

    /// Moves the store clock forward (leases and retention expire without sleeping).
    pub(crate) async fn advance(&self, by: Duration) {
        self.fixture.advance(by).await;
    }

    /// Rows of one of the app's tables.
    pub(crate) async fn app_rows(&self, table: &str) -> i64 {
        assert!(matches!(
            table,
            "documents" | "document_versions" | "index_entries"
        ));
        row_count(self.indexer.store().pool(), self.indexer.schema(), table).await
    }

    /// Stored entries (visible or not) of one version.
    pub(crate) async fn stored_entries(&self, document: &str, version: i64) -> Vec<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT body FROM \"{}\".index_entries WHERE document_id = $1 AND version = $2 ORDER BY chunk",
            self.indexer.schema()
        )))
        .bind(document)
        .bind(version)
        .fetch_all(self.indexer.store().pool())
        .await
        .expect("read entries")
    }

    /// The bodies readers see for a document, with the version each came from.
    pub(crate) async fn visible(&self, document: &str) -> Vec<(i64, String)> {
        self.indexer
            .visible_entries(document)
            .await
            .expect("read visible entries")
            .into_iter()
            .map(|e| (e.version, e.body))
            .collect()
    }

    pub(crate) async fn status(&self, task: TaskId) -> Status {
        self.indexer
            .store()
            .get(task)
            .await
            .expect("get")
            .expect("the task exists")
            .status
    }

    /// Uploads and indexes a version to completion, asserting it is done.
    pub(crate) async fn upload_and_index(&self, document: &str, version: i64, body: &str) -> Indexed {
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
pub(crate) fn expected_visible(version: i64, body: &str) -> Vec<(i64, String)> {
    chunk(body).into_iter().map(|c| (version, c)).collect()
}

pub(crate) const V1: &str = "Decision: ship in March.\n\nOwner: Ana.";
pub(crate) const V2: &str = "Decision: ship in April.\n\nOwner: Ben.\n\nRisk: supplier delay.";
