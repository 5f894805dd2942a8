//! Document indexing on taskfence and PostgreSQL: a template for **versioned**
//! work, where each version of a document is indexed once and a late worker
//! never makes an older version current over a newer one.
//!
//! - [`Indexer::upload`] saves version *v* of document *d* and submits the task
//!   "index version *v* of *d*" in one transaction. The task's request key is
//!   (document, version, stage), so a retried upload of the same version is the
//!   same task; its input hash is the content hash, so the same version with
//!   other bytes is a conflict, not new work.
//! - [`Indexer::index_once`] claims the task, chunks the text, and in **one
//!   transaction** writes the entries (unique per document, version and chunk),
//!   moves the document's current version forward only (`… WHERE
//!   current_version < v`) and completes the task with
//!   [`PgStore::on`]`(&mut tx).complete(…)`. A rejected completion rolls all of it back.
//! - Readers see [`Indexer::visible_entries`]: only the current version's entries.
//!
//! The README answers four questions to ask of any idempotent work, for this case.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), document_indexing::Error> {
//! use std::time::Duration;
//! use document_indexing::{Indexed, Indexer};
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! let store = taskfence::PgStore::new(pool);
//! store.migrate().await?;
//! let indexer = Indexer::new(store, "docs")?;
//! indexer.migrate().await?;
//!
//! let task = indexer.upload("handbook", 1, "Decisions.\n\nOwners.").await?.task;
//! let done = indexer.index_once("worker-a", task.id, Duration::from_secs(30)).await?;
//! assert!(matches!(done, Indexed::Done { became_current: true, .. }));
//! assert_eq!(indexer.visible_entries("handbook").await?.len(), 2);
//! # Ok(()) }
//! ```

use std::time::Duration;

use sqlx::{Connection, PgConnection, Row};
use taskfence::error::InvalidInput;
use taskfence::limits;
use taskfence::{
    Claim, ClaimRequest, Failure, Fenced, InputHash, Lease, NewTask, PgStore, Rejection, RequestKey,
    Response, RetryPolicy, Submitted, Task, TaskId, TaskStore,
};

/// The scope of every task. A multi-tenant application puts the tenant here
/// (and in the documents' key), so two tenants' `handbook` never share work.
pub const SCOPE: &str = "documents";
/// The kind of work: processing an uploaded document version.
pub const OPERATION: &str = "document.ingest";
/// The processing stage this crate runs. It is part of the request key: other
/// stages of the same version (embedding, summarizing) are other work.
pub const STAGE: &str = "index";
/// Longest document id, in bytes (so the request key stays within
/// [`limits::MAX_KEY_LEN`]).
pub const MAX_DOCUMENT_LEN: usize = 200;
/// Largest document body, in bytes.
pub const MAX_BODY_LEN: usize = 4 * 1024 * 1024;
/// Longest chunk, in characters; longer paragraphs are split between words.
pub const MAX_CHUNK_CHARS: usize = 400;

/// What went wrong. Rejections of a late worker are not errors: they are
/// [`Indexed::Rejected`].
///
/// ```
/// use document_indexing::Error;
/// let err = Error::from(taskfence::error::InvalidInput::Blank { field: "document" });
/// assert_eq!(err.to_string(), "invalid input: document is empty or blank");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input breaks a documented limit. Nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// This version of the document was uploaded before with other content.
    /// A version is immutable: upload the new content as a new version.
    /// Nothing was written.
    #[error("version {version} of {document:?} was already uploaded with other content")]
    VersionConflict {
        /// The document.
        document: String,
        /// The version.
        version: i64,
    },
    /// The task id does not name a task of this application (wrong payload,
    /// or its document version is missing).
    #[error("task {0} is not an indexing task of this application")]
    NotAnIndexingTask(TaskId),
    /// The task store failed.
    #[error("task store: {0}")]
    Store(#[source] taskfence::Error),
    /// The application's own tables failed. For a failed commit the outcome is
    /// unknown: the next claim of the task tells (completed or not).
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl From<taskfence::Error> for Error {
    fn from(err: taskfence::Error) -> Self {
        match err {
            taskfence::Error::InvalidInput(invalid) => Self::InvalidInput(invalid),
            other => Self::Store(other),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`Indexer::upload`] did.
///
/// ```no_run
/// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
/// let uploaded = indexer.upload("handbook", 2, "New text.").await?;
/// if !uploaded.created {
///     println!("a retry: task {} already exists", uploaded.task.id);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Uploaded {
    /// The indexing task of this version, new or existing.
    pub task: Task,
    /// `false` when this version was uploaded before: nothing new was written.
    pub created: bool,
}

/// What [`Indexer::index_once`] (or [`Indexer::commit`]) did.
///
/// ```
/// # fn f(outcome: document_indexing::Indexed) {
/// use document_indexing::Indexed;
/// match outcome {
///     Indexed::Done { became_current, .. } => println!("indexed; current now: {became_current}"),
///     Indexed::AlreadyDone(_) => println!("a duplicate delivery: nothing to do"),
///     Indexed::Rejected(why) => println!("this worker lost the task ({why}); nothing was written"),
///     Indexed::NotClaimed(claim) => println!("not now: {claim:?}"),
/// }
/// # }
/// ```
#[derive(Debug)]
pub enum Indexed {
    /// This run wrote the entries and completed the task, in one transaction.
    Done {
        /// The completed task.
        task: Task,
        /// Entries this run inserted (0 when they existed already).
        entries_written: u64,
        /// Whether this version became the document's current version. `false`
        /// when a newer version was already current: its entries are stored,
        /// never visible.
        became_current: bool,
    },
    /// The task was completed before; no entries were written, no attempt counted.
    AlreadyDone(Task),
    /// The completion was refused (lease expired, taken over, already
    /// completed by the new owner): the transaction was rolled back, so none
    /// of this run's entries exist and the current version did not move.
    Rejected(Rejection),
    /// The task cannot be worked on now (busy, backing off, failed,
    /// cancelled, not found); see the claim.
    NotClaimed(Claim),
}

/// One claimed task with its work prepared: the lease (the fencing token), the
/// version it is about and the chunks to write. Made by [`Indexer::claim`],
/// consumed by [`Indexer::commit`].
///
/// ```no_run
/// # async fn f(indexer: document_indexing::Indexer, id: taskfence::TaskId) -> document_indexing::Result<()> {
/// use document_indexing::Claimed;
/// if let Claimed::Job(job) = indexer.claim(id, "worker-a", std::time::Duration::from_secs(30)).await? {
///     println!("{} v{}: {} chunks", job.document(), job.version(), job.chunks().len());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Job {
    lease: Lease,
    document: String,
    version: i64,
    chunks: Vec<String>,
}

impl Job {
    /// The document.
    pub fn document(&self) -> &str {
        &self.document
    }
    /// The version being indexed.
    pub fn version(&self) -> i64 {
        self.version
    }
    /// The chunks to write, in order (chunk number = index).
    pub fn chunks(&self) -> &[String] {
        &self.chunks
    }
    /// The lease this job will complete with.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// What [`Indexer::claim`] found.
///
/// ```
/// # fn f(c: document_indexing::Claimed) {
/// use document_indexing::Claimed;
/// let must_work = matches!(c, Claimed::Job(_));
/// # }
/// ```
#[derive(Debug)]
pub enum Claimed {
    /// This worker holds the task: write the job with [`Indexer::commit`].
    Job(Job),
    /// The task is done already (a duplicate delivery).
    Done(Task),
    /// Not claimable now (busy, backoff, failed, cancelled, not found).
    NotNow(Claim),
}

/// One entry readers can search.
///
/// ```no_run
/// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
/// for entry in indexer.visible_entries("handbook").await? {
///     println!("v{} #{}: {}", entry.version, entry.chunk, entry.body);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The document.
    pub document: String,
    /// The version the entry was made from.
    pub version: i64,
    /// Its position in that version (0-based).
    pub chunk: i32,
    /// The chunk's text.
    pub body: String,
}

/// The application: uploads versions, indexes them, serves the visible entries.
/// Its tables live in their own schema, next to taskfence's.
///
/// ```no_run
/// # async fn f(store: taskfence::PgStore) -> document_indexing::Result<()> {
/// let indexer = document_indexing::Indexer::new(store, "docs")?;
/// indexer.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Indexer {
    store: PgStore,
    schema: String,
    policy: RetryPolicy,
    retention: Duration,
}

impl Indexer {
    /// An indexer whose tables live in `schema` (a lowercase SQL identifier),
    /// with taskfence's task tables in `store`.
    ///
    /// ```no_run
    /// # fn f(store: taskfence::PgStore) {
    /// assert!(document_indexing::Indexer::new(store, "Bad Name").is_err());
    /// # }
    /// ```
    pub fn new(store: PgStore, schema: &str) -> Result<Self> {
        let mut chars = schema.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        if !first_ok
            || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            || schema.len() > 63
        {
            return Err(InvalidInput::NotAnIdentifier { field: "schema" }.into());
        }
        Ok(Self {
            store,
            schema: schema.to_owned(),
            policy: RetryPolicy::default(),
            retention: NewTask::DEFAULT_RETENTION,
        })
    }

    /// How long taskfence keeps each upload's dedup record (default 7 days).
    /// After it is purged, re-uploading the same version is a new task; the
    /// unique entry key and the forward-only current version keep that harmless.
    ///
    /// ```no_run
    /// # fn f(indexer: document_indexing::Indexer) {
    /// let indexer = indexer.retention(std::time::Duration::from_secs(30 * 24 * 3600));
    /// # }
    /// ```
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The retry budget of new indexing tasks.
    ///
    /// ```no_run
    /// # fn f(indexer: document_indexing::Indexer) {
    /// let indexer = indexer.policy(taskfence::RetryPolicy::default().max_attempts(5));
    /// # }
    /// ```
    #[must_use]
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The task store.
    ///
    /// ```no_run
    /// # fn f(indexer: document_indexing::Indexer) {
    /// let pool = indexer.store().pool();
    /// # }
    /// ```
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// The schema of the application's tables.
    ///
    /// ```no_run
    /// # fn f(indexer: document_indexing::Indexer) {
    /// println!("{}", indexer.schema());
    /// # }
    /// ```
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Creates the application's schema and tables (idempotent). taskfence's
    /// own tables are created by [`PgStore::migrate`].
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
    /// indexer.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.store.pool().begin().await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS \"{s}\"; SET LOCAL search_path TO \"{s}\";",
            s = self.schema
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::raw_sql(include_str!("schema.sql"))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Saves version `version` of `document` and submits its indexing task, in
    /// one transaction: both exist, or neither.
    ///
    /// The same version uploaded again with the same content is the same task
    /// ([`Uploaded::created`] is `false`, nothing written). With other content
    /// it is [`Error::VersionConflict`]: a version never changes, so a
    /// different body must be a new version, and silently indexing either one
    /// would answer searches from the wrong text.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
    /// let first = indexer.upload("handbook", 1, "Text.").await?;
    /// let retry = indexer.upload("handbook", 1, "Text.").await?;
    /// assert_eq!(first.task.id, retry.task.id);
    /// assert!(indexer.upload("handbook", 1, "Other text.").await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn upload(&self, document: &str, version: i64, body: &str) -> Result<Uploaded> {
        let work = WorkKey::new(document, version)?;
        limits::check_len("body", body.len(), MAX_BODY_LEN)?;
        if body.trim().is_empty() {
            return Err(InvalidInput::Blank { field: "body" }.into());
        }
        limits::check_free_text("body", body)?;
        let hash = content_hash(body);
        let new = NewTask::new(work.request_key(), hash)
            .payload(work.payload())
            .policy(self.policy)
            .retention(self.retention);
        new.validate()?;

        let mut tx = self.store.pool().begin().await?;
        match self.upload_in(&mut tx, &work, hash, body, new).await {
            Ok(submitted) => {
                tx.commit().await?;
                Ok(Uploaded {
                    created: submitted.is_created(),
                    task: submitted.into_task(),
                })
            }
            Err(err) => {
                // Roll back now rather than when the connection is next used,
                // so no lock outlives the call. If the rollback fails the
                // session is gone and the server discards the transaction
                // anyway: the upload's own error is the one to report.
                let _ = tx.rollback().await;
                Err(err)
            }
        }
    }

    /// The upload's writes, on the caller's transaction.
    async fn upload_in(
        &self,
        tx: &mut PgConnection,
        work: &WorkKey,
        hash: InputHash,
        body: &str,
        new: NewTask,
    ) -> Result<Submitted> {
        let s = &self.schema;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{s}\".documents (id) VALUES ($1) ON CONFLICT (id) DO NOTHING"
        )))
        .bind(&work.document)
        .execute(&mut *tx)
        .await?;
        // The app's own record of the version: kept for as long as the
        // document, so it also catches a conflicting re-upload after
        // taskfence's dedup record was purged.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{s}\".document_versions (document_id, version, content_hash, body)
             VALUES ($1, $2, $3, $4) ON CONFLICT (document_id, version) DO NOTHING"
        )))
        .bind(&work.document)
        .bind(work.version)
        .bind(&hash.as_bytes()[..])
        .bind(body)
        .execute(&mut *tx)
        .await?;
        let stored: Vec<u8> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT content_hash FROM \"{s}\".document_versions WHERE document_id = $1 AND version = $2"
        )))
        .bind(&work.document)
        .bind(work.version)
        .fetch_one(&mut *tx)
        .await?;
        let conflict = || Error::VersionConflict {
            document: work.document.clone(),
            version: work.version,
        };
        if stored[..] != hash.as_bytes()[..] {
            return Err(conflict());
        }
        match self.store.on(tx).submit(new).await {
            Ok(submitted) => Ok(submitted),
            Err(taskfence::Error::KeyConflict { .. }) => Err(conflict()),
            Err(err) => Err(err.into()),
        }
    }

    /// Handles one delivery of "index task `task_id`": [`claim`](Self::claim),
    /// then [`commit`](Self::commit). Safe to call for every duplicate
    /// delivery: a completed task answers [`Indexed::AlreadyDone`] without
    /// writing anything.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer, id: taskfence::TaskId) -> document_indexing::Result<()> {
    /// let outcome = indexer.index_once("worker-a", id, std::time::Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn index_once(&self, worker: &str, task_id: TaskId, lease: Duration) -> Result<Indexed> {
        match self.claim(task_id, worker, lease).await? {
            Claimed::Job(job) => {
                let mut conn = self.store.pool().acquire().await?;
                self.commit(&mut conn, job).await
            }
            Claimed::Done(task) => Ok(Indexed::AlreadyDone(task)),
            Claimed::NotNow(claim) => Ok(Indexed::NotClaimed(claim)),
        }
    }

    /// Claims the task and prepares its job: reads the version's text and
    /// chunks it. No transaction is held while chunking (nor, in a real
    /// indexer, while calling an embedding service).
    ///
    /// A task whose version cannot be read is failed permanently and reported
    /// as [`Error::NotAnIndexingTask`]: no retry could succeed.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer, id: taskfence::TaskId) -> document_indexing::Result<()> {
    /// let claimed = indexer.claim(id, "worker-a", std::time::Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim(&self, task_id: TaskId, worker: &str, lease: Duration) -> Result<Claimed> {
        let lease = match self
            .store
            .claim(task_id, ClaimRequest::new(worker, lease))
            .await?
        {
            Claim::Acquired(lease) => lease,
            Claim::Completed(task) => return Ok(Claimed::Done(task)),
            other => return Ok(Claimed::NotNow(other)),
        };
        let found = match WorkKey::from_task(lease.task()) {
            Some(work) => self
                .version_body(&work, lease.task().input_hash)
                .await?
                .map(|body| (work, body)),
            None => None,
        };
        let Some((work, body)) = found else {
            let failure = Failure::permanent("not an indexing task of this application");
            let _ = self.store.fail(lease, failure).await?;
            return Err(Error::NotAnIndexingTask(task_id));
        };
        Ok(Claimed::Job(Job {
            lease,
            document: work.document,
            version: work.version,
            chunks: chunk(&body),
        }))
    }

    /// Writes the job in **one transaction** on `conn`: inserts its entries
    /// (a conflict on (document, version, chunk) inserts nothing), advances the
    /// document's current version only forward, and completes the task with
    /// [`PgStore::on`]`(&mut tx).complete(…)`. Accepted: commit. Rejected: roll back, so a
    /// worker that lost its task leaves no entries and moves nothing.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer, job: document_indexing::Job) -> document_indexing::Result<()> {
    /// let mut conn = indexer.store().pool().acquire().await?;
    /// let outcome = indexer.commit(&mut conn, job).await?;
    /// # Ok(()) }
    /// ```
    pub async fn commit(&self, conn: &mut PgConnection, job: Job) -> Result<Indexed> {
        let mut tx = conn.begin().await?;
        match self.commit_in(&mut tx, job).await {
            Ok(done @ Indexed::Done { .. }) => {
                tx.commit().await?;
                Ok(done)
            }
            other => {
                // Rejected or failed: nothing of this run may stay. A failed
                // rollback means a dead session, which the server rolls back.
                let _ = tx.rollback().await;
                other
            }
        }
    }

    /// The job's writes and the completion, on the caller's transaction.
    /// Fenced first ([`PgStore::on`]`(tx).fence(&lease)`): the entries are
    /// written only under a current lease, which the row lock then holds
    /// until the commit; a worker that lost its task writes nothing at all.
    async fn commit_in(&self, tx: &mut PgConnection, job: Job) -> Result<Indexed> {
        if let Fenced::Rejected(rejection) = self.store.on(tx).fence(&job.lease).await? {
            return Ok(Indexed::Rejected(rejection));
        }
        let entries_written = self.write_entries(tx, &job).await?;
        let became_current = self.advance_current(tx, &job).await?;
        let summary = format!(
            "{} chunks of {:?} v{}",
            job.chunks.len(),
            job.document,
            job.version
        );
        Ok(
            match self
                .store
                .on(tx)
                .complete(job.lease, Response::from(summary))
                .await?
            {
                Fenced::Accepted(task) => Indexed::Done {
                    task,
                    entries_written,
                    became_current,
                },
                Fenced::Rejected(rejection) => Indexed::Rejected(rejection),
            },
        )
    }

    /// Inserts the job's entries on `conn` (inside the caller's transaction);
    /// returns how many were new. Exposed so tests can crash between this and
    /// the completion.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer, job: document_indexing::Job) -> document_indexing::Result<()> {
    /// let mut tx = indexer.store().pool().begin().await?;
    /// let written = indexer.write_entries(&mut tx, &job).await?;
    /// tx.rollback().await?; // as a crash would: nothing stays
    /// # Ok(()) }
    /// ```
    pub async fn write_entries(&self, conn: &mut PgConnection, job: &Job) -> Result<u64> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{}\".index_entries (document_id, version, chunk, body)
             SELECT $1, $2, (c.n - 1)::integer, c.body FROM unnest($3::text[]) WITH ORDINALITY AS c(body, n)
             ON CONFLICT (document_id, version, chunk) DO NOTHING",
            self.schema
        )))
        .bind(&job.document)
        .bind(job.version)
        .bind(&job.chunks)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    /// Makes the job's version current if it is newer than the current one
    /// (`UPDATE … WHERE current_version < v`); `false` when a newer version is
    /// current already. Under Read Committed a concurrent update of the same
    /// document is waited for and the condition rechecked on the newest row,
    /// so two workers finishing in any order leave the highest version current.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer, job: document_indexing::Job) -> document_indexing::Result<()> {
    /// let mut tx = indexer.store().pool().begin().await?;
    /// let current = indexer.advance_current(&mut tx, &job).await?;
    /// # Ok(()) }
    /// ```
    pub async fn advance_current(&self, conn: &mut PgConnection, job: &Job) -> Result<bool> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE \"{}\".documents SET current_version = $2 WHERE id = $1 AND current_version < $2",
            self.schema
        )))
        .bind(&job.document)
        .bind(job.version)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The document's current version: `None` for an unknown document,
    /// `Some(0)` before any version was indexed.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
    /// let current = indexer.current_version("handbook").await?;
    /// # Ok(()) }
    /// ```
    pub async fn current_version(&self, document: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT current_version FROM \"{}\".documents WHERE id = $1",
            self.schema
        )))
        .bind(document)
        .fetch_optional(self.store.pool())
        .await?)
    }

    /// What readers see of a document: the entries of its current version only.
    ///
    /// ```no_run
    /// # async fn f(indexer: document_indexing::Indexer) -> document_indexing::Result<()> {
    /// let entries = indexer.visible_entries("handbook").await?;
    /// # Ok(()) }
    /// ```
    pub async fn visible_entries(&self, document: &str) -> Result<Vec<Entry>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT document_id, version, chunk, body FROM \"{}\".visible_entries
             WHERE document_id = $1 ORDER BY chunk",
            self.schema
        )))
        .bind(document)
        .fetch_all(self.store.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Entry {
                    document: row.try_get(0)?,
                    version: row.try_get(1)?,
                    chunk: row.try_get(2)?,
                    body: row.try_get(3)?,
                })
            })
            .collect()
    }

    /// The saved body of a version, if its content hash is the task's input hash.
    async fn version_body(&self, work: &WorkKey, hash: InputHash) -> Result<Option<String>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT content_hash, body FROM \"{}\".document_versions WHERE document_id = $1 AND version = $2",
            self.schema
        )))
        .bind(&work.document)
        .bind(work.version)
        .fetch_optional(self.store.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let stored: Vec<u8> = row.try_get(0)?;
        Ok((stored[..] == hash.as_bytes()[..])
            .then(|| row.try_get(1))
            .transpose()?)
    }
}

/// The content hash of a body: the task's input hash, so the request key
/// (document, version, stage) is bound to these exact bytes.
///
/// ```
/// use document_indexing::content_hash;
/// assert_eq!(content_hash("Text."), content_hash("Text."));
/// assert_ne!(content_hash("Text."), content_hash("Text!"));
/// ```
pub fn content_hash(body: &str) -> InputHash {
    InputHash::of([body])
}

/// Splits a body into chunks: paragraphs (separated by blank lines), with
/// whitespace collapsed, each cut between words into pieces of at most
/// [`MAX_CHUNK_CHARS`] characters (a longer single word is its own chunk).
///
/// Deterministic on purpose: a retry must produce the same chunk numbers, or
/// the unique key (document, version, chunk) could not recognize its entries.
///
/// ```
/// let chunks = document_indexing::chunk("First  paragraph\nwraps.\n\n\nSecond.");
/// assert_eq!(chunks, ["First paragraph wraps.", "Second."]);
/// ```
pub fn chunk(body: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    for paragraph in body.split("\n\n") {
        let mut current = String::new();
        for word in paragraph.split_whitespace() {
            if !current.is_empty() && current.chars().count() + 1 + word.chars().count() > MAX_CHUNK_CHARS {
                chunks.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        if !current.is_empty() {
            chunks.push(current);
        }
    }
    chunks
}

/// The identity of one indexing task: (document, version) at [`STAGE`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct WorkKey {
    document: String,
    version: i64,
}

impl WorkKey {
    fn new(document: &str, version: i64) -> Result<Self, InvalidInput> {
        limits::check_text("document", document, MAX_DOCUMENT_LEN)?;
        if version < 1 {
            return Err(InvalidInput::OutOfRange {
                field: "version",
                value: version.to_string(),
                min: "1".into(),
                max: i64::MAX.to_string(),
            });
        }
        Ok(Self {
            document: document.to_owned(),
            version,
        })
    }

    /// `index/v<version>/<document>`: stage and version first, so the
    /// document id (which may contain `/`) is simply the rest.
    fn key(&self) -> String {
        format!("{STAGE}/v{}/{}", self.version, self.document)
    }

    fn request_key(&self) -> RequestKey {
        RequestKey::new(SCOPE, OPERATION, self.key())
    }

    fn payload(&self) -> Vec<u8> {
        self.key().into_bytes()
    }

    /// Reads the work back from a task's payload, if it is one of ours.
    fn from_task(task: &Task) -> Option<Self> {
        if task.key.scope != SCOPE || task.key.operation != OPERATION {
            return None;
        }
        let text = std::str::from_utf8(&task.payload).ok()?;
        let rest = text.strip_prefix(STAGE)?.strip_prefix("/v")?;
        let (version, document) = rest.split_once('/')?;
        Self::new(document, version.parse().ok()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_long_paragraphs_between_words() {
        let word = "abcd";
        let body = vec![word; 200].join(" "); // 999 chars
        let chunks = chunk(&body);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| c.chars().count() <= MAX_CHUNK_CHARS));
        assert_eq!(chunks.join(" "), body);
    }

    #[test]
    fn the_key_names_stage_version_and_document() {
        let work = WorkKey::new("reports/q3", 7).unwrap();
        assert_eq!(work.key(), "index/v7/reports/q3");
        assert_ne!(work.key(), WorkKey::new("reports/q3", 8).unwrap().key());
    }

    #[test]
    fn bad_keys_are_typed_errors() {
        assert_eq!(
            WorkKey::new(" ", 1),
            Err(InvalidInput::Blank { field: "document" })
        );
        assert!(matches!(
            WorkKey::new("d", 0),
            Err(InvalidInput::OutOfRange { field: "version", .. })
        ));
        assert!(matches!(
            WorkKey::new(&"d".repeat(MAX_DOCUMENT_LEN + 1), 1),
            Err(InvalidInput::TooLong {
                field: "document",
                ..
            })
        ));
    }
}
