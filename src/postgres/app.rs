//! A service's own rows beside taskfence's, on the same PostgreSQL:
//! [`CompleteWith`] (write them in the completion's transaction, and
//! announce the commit), [`FollowUp`] (a task submitted there too), [`listen_saved`] (hear those announcements) and
//! [`app_schema`] (the service's tables in a schema of their own).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

use crate::error::{Error, Result};
use crate::intercept::{Intercept, Intercepted};
use crate::store::{Fenced, Lease, TaskStore};
use crate::task::{Response, Task};

use super::PgStore;

/// What a service writes with each accepted completion, in the
/// completion's own transaction (see [`CompleteWith`]).
///
/// Why: a result the service keeps in its own tables (a chat reply row, a
/// follow-up task) must exist exactly when the task is completed. Written
/// in one transaction with the fenced completion, a refused completion (a
/// stale worker, an expired lease) writes none of it, and a crash leaves
/// both or neither.
///
/// ```
/// use taskfence::postgres::CompletionWrites;
/// use taskfence::{PgStore, Task};
///
/// /// Saves each result as a row of the service's `results` table.
/// struct SaveResult;
///
/// #[async_trait::async_trait]
/// impl CompletionWrites for SaveResult {
///     async fn write(&self, _store: &PgStore, tx: &mut sqlx::PgConnection, task: &Task, attempt: u32) -> taskfence::Result<()> {
///         let text = task.response.as_ref().and_then(|r| r.as_str()).unwrap_or_default();
///         sqlx::query("INSERT INTO results (task_id, text, attempt) VALUES ($1, $2, $3)")
///             .bind(task.id.as_uuid())
///             .bind(text)
///             .bind(attempt as i32)
///             .execute(tx)
///             .await
///             .map_err(taskfence::Error::storage)?;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait CompletionWrites: Send + Sync + 'static {
    /// Writes the service's rows for `task`, just completed (its response
    /// saved) on `attempt`, on `tx`: the completion's transaction, the task
    /// row still locked. `store` runs taskfence's operations there too
    /// (`store.on(tx).submit(…)`). An error rolls everything back, the
    /// completion included, and is the completion's error.
    async fn write(&self, store: &PgStore, tx: &mut PgConnection, task: &Task, attempt: u32) -> Result<()>;

    /// Runs after the commit (wake whoever consumes what [`write`](Self::write)
    /// submitted). Does nothing by default.
    ///
    /// ```
    /// # use taskfence::{PgStore, Task, postgres::CompletionWrites};
    /// struct Nothing;
    /// #[async_trait::async_trait]
    /// impl CompletionWrites for Nothing {
    ///     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
    ///     fn committed(&self, task: &Task) { println!("{} saved", task.id) }
    /// }
    /// ```
    fn committed(&self, task: &Task) {
        let _ = task;
    }
}

/// Both, `A` first, in the one transaction; both run after the commit.
///
/// ```
/// # use taskfence::{PgStore, Task, postgres::{CompletionWrites, FollowUp}};
/// # struct SaveResult;
/// # #[async_trait::async_trait]
/// # impl CompletionWrites for SaveResult {
/// #     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
/// # }
/// fn writes(notify: Option<FollowUp>) -> impl CompletionWrites {
///     (SaveResult, notify)
/// }
/// ```
#[async_trait]
impl<A: CompletionWrites, B: CompletionWrites> CompletionWrites for (A, B) {
    async fn write(&self, store: &PgStore, tx: &mut PgConnection, task: &Task, attempt: u32) -> Result<()> {
        self.0.write(store, tx, task, attempt).await?;
        self.1.write(store, tx, task, attempt).await
    }

    fn committed(&self, task: &Task) {
        self.0.committed(task);
        self.1.committed(task);
    }
}

/// The writes when configured, nothing otherwise (a feature turned off).
#[async_trait]
impl<W: CompletionWrites> CompletionWrites for Option<W> {
    async fn write(&self, store: &PgStore, tx: &mut PgConnection, task: &Task, attempt: u32) -> Result<()> {
        match self {
            Some(writes) => writes.write(store, tx, task, attempt).await,
            None => Ok(()),
        }
    }

    fn committed(&self, task: &Task) {
        if let Some(writes) = self {
            writes.committed(task);
        }
    }
}

/// A follow-up task submitted with each accepted completion, in its
/// transaction (a [`CompletionWrites`]): a "result ready" notification, an
/// index update. It exists exactly when the completion does, and there is one
/// per completed task, however often the completion is retried: its request
/// key is (the task's scope, the follow-up's operation, the task's id), its
/// input the task's id, so a second submission is `Existing`.
///
/// Why: "when this is done, do that once" is the same few lines in every
/// service, and each copy can get the key wrong (a key per attempt sends the
/// notification twice) or submit outside the transaction (a notification of
/// a result that was rolled back).
///
/// ```
/// use taskfence::postgres::FollowUp;
/// use taskfence::{RetryPolicy, Task};
///
/// let notify = FollowUp::new("chat.notify", |done: &Task| Ok(done.id.to_string().into_bytes()))
///     .policy(RetryPolicy::default().max_attempts(10))
///     .retention(std::time::Duration::from_secs(86_400))
///     .without_handoff()
///     .after_commit(|| println!("wake the notification consumer"));
/// assert_eq!(notify.operation(), "chat.notify");
/// ```
#[derive(Clone)]
pub struct FollowUp {
    operation: String,
    payload: Arc<FollowUpPayload>,
    policy: Option<crate::RetryPolicy>,
    retention: Option<std::time::Duration>,
    handoff: bool,
    after_commit: Option<Arc<dyn Fn() + Send + Sync>>,
}

type FollowUpPayload = dyn Fn(&Task) -> Result<Vec<u8>> + Send + Sync;

impl std::fmt::Debug for FollowUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowUp")
            .field("operation", &self.operation)
            .field("policy", &self.policy)
            .field("retention", &self.retention)
            .field("handoff", &self.handoff)
            .finish_non_exhaustive()
    }
}

impl FollowUp {
    /// Follow-ups of `operation` whose payload `payload` renders from the
    /// completed task (its response saved); an error rolls the completion back.
    ///
    /// ```
    /// let f = taskfence::postgres::FollowUp::new("index.update", |done| Ok(done.payload.clone()));
    /// ```
    pub fn new(
        operation: impl Into<String>,
        payload: impl Fn(&Task) -> Result<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            operation: operation.into(),
            payload: Arc::new(payload),
            policy: None,
            retention: None,
            handoff: true,
            after_commit: None,
        }
    }

    /// The follow-up's retry budget (default: [`NewTask`](crate::NewTask)'s).
    ///
    /// ```
    /// let f = taskfence::postgres::FollowUp::new("op", |_| Ok(Vec::new())).policy(taskfence::RetryPolicy::default());
    /// ```
    pub fn policy(mut self, policy: crate::RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// How long the follow-up's key is kept (default: [`NewTask`](crate::NewTask)'s).
    ///
    /// ```
    /// let f = taskfence::postgres::FollowUp::new("op", |_| Ok(Vec::new())).retention(std::time::Duration::from_secs(60));
    /// ```
    pub fn retention(mut self, retention: std::time::Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// No outbox row: its consumer claims from the store itself
    /// ([`NewTask::without_handoff`](crate::NewTask::without_handoff)).
    ///
    /// ```
    /// let f = taskfence::postgres::FollowUp::new("op", |_| Ok(Vec::new())).without_handoff();
    /// ```
    pub fn without_handoff(mut self) -> Self {
        self.handoff = false;
        self
    }

    /// Runs after each commit: wake the follow-up's consumer
    /// (`Consumer::source().waker()`), so it starts at once, not at its next poll.
    ///
    /// ```
    /// let f = taskfence::postgres::FollowUp::new("op", |_| Ok(Vec::new())).after_commit(|| ());
    /// ```
    pub fn after_commit(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.after_commit = Some(Arc::new(f));
        self
    }

    /// The follow-up's operation.
    ///
    /// ```
    /// assert_eq!(taskfence::postgres::FollowUp::new("op", |_| Ok(Vec::new())).operation(), "op");
    /// ```
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The follow-up task of `done`, as [`write`](CompletionWrites::write) submits it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
    /// use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskStore, postgres::FollowUp};
    /// let store = MemoryStore::new();
    /// let done = store.submit(NewTask::new(RequestKey::new("alice", "op", "k"), InputHash::of(["x"]))).await?.into_task();
    /// let next = FollowUp::new("notify", |_| Ok(Vec::new())).task_for(&done)?;
    /// assert_eq!((next.key.scope.as_str(), next.key.operation.as_str()), ("alice", "notify"));
    /// assert_eq!(next.key.key, done.id.to_string());
    /// # Ok(()) }
    /// ```
    pub fn task_for(&self, done: &Task) -> Result<crate::NewTask> {
        let id = done.id.to_string();
        let key = crate::RequestKey::new(&done.key.scope, &self.operation, &id);
        let mut new = crate::NewTask::new(key, crate::InputHash::of([&id])).payload((self.payload)(done)?);
        if let Some(policy) = self.policy {
            new = new.policy(policy);
        }
        if let Some(retention) = self.retention {
            new = new.retention(retention);
        }
        Ok(if self.handoff { new } else { new.without_handoff() })
    }
}

#[async_trait]
impl CompletionWrites for FollowUp {
    async fn write(&self, store: &PgStore, tx: &mut PgConnection, task: &Task, _attempt: u32) -> Result<()> {
        store.on(tx).submit(self.task_for(task)?).await?;
        Ok(())
    }

    fn committed(&self, _task: &Task) {
        if let Some(after_commit) = &self.after_commit {
            after_commit();
        }
    }
}

/// An [`Intercept`] whose `complete` is one transaction: the fenced
/// completion ([`PgStore::on`]`(&mut tx).complete`), the service's
/// [`CompletionWrites`] and, with [`notify`](Self::notify), a `pg_notify`
/// of the task id, delivered on commit, never before ([`listen_saved`]
/// hears it). Every other operation is the store's own.
///
/// Why an intercept: a [`Consumer`](crate::runtime::Consumer) completes
/// through [`TaskStore::complete_many`], which an [`Intercepted`] store turns
/// into one `complete` per task; wrapping the store keeps the whole runtime
/// (claims, lease renewal, retry budget, graceful stop) and changes only
/// what a completion writes.
///
/// ```no_run
/// # use taskfence::{PgStore, Task, postgres::{CompleteWith, CompletionWrites}};
/// # struct SaveResult;
/// # #[async_trait::async_trait]
/// # impl CompletionWrites for SaveResult {
/// #     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
/// # }
/// # fn f(store: PgStore) {
/// let results = CompleteWith::new(store, SaveResult).notify("taskfence_result_saved").into_store();
/// // A `Consumer` on `StoreQueue::new(Arc::new(results))` saves the rows with each completion.
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CompleteWith<W> {
    store: PgStore,
    writes: W,
    channel: Option<String>,
}

impl<W: CompletionWrites> CompleteWith<W> {
    /// Completions on `store` that also run `writes`.
    ///
    /// ```no_run
    /// # use taskfence::{PgStore, Task, postgres::{CompleteWith, CompletionWrites}};
    /// # struct SaveResult;
    /// # #[async_trait::async_trait]
    /// # impl CompletionWrites for SaveResult {
    /// #     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
    /// # }
    /// # fn f(store: PgStore) {
    /// let intercept = CompleteWith::new(store, SaveResult);
    /// # }
    /// ```
    pub fn new(store: PgStore, writes: W) -> Self {
        Self {
            store,
            writes,
            channel: None,
        }
    }

    /// Also `pg_notify(channel, task id)` in the transaction. Name the
    /// channel per deployment (after the taskfence schema, say), so two
    /// sharing a database never hear each other.
    ///
    /// ```no_run
    /// # use taskfence::{PgStore, Task, postgres::{CompleteWith, CompletionWrites}};
    /// # struct SaveResult;
    /// # #[async_trait::async_trait]
    /// # impl CompletionWrites for SaveResult {
    /// #     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
    /// # }
    /// # fn f(store: PgStore) {
    /// let intercept = CompleteWith::new(store, SaveResult).notify("taskfence_result_saved");
    /// # }
    /// ```
    pub fn notify(mut self, channel: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self
    }

    /// The store a consumer runs on: the [`PgStore`] wrapped with this intercept.
    ///
    /// ```no_run
    /// # use taskfence::{PgStore, Task, postgres::{CompleteWith, CompletionWrites}};
    /// # struct SaveResult;
    /// # #[async_trait::async_trait]
    /// # impl CompletionWrites for SaveResult {
    /// #     async fn write(&self, _: &PgStore, _: &mut sqlx::PgConnection, _: &Task, _: u32) -> taskfence::Result<()> { Ok(()) }
    /// # }
    /// # fn f(store: PgStore) {
    /// let store: taskfence::intercept::Intercepted<PgStore, _> = CompleteWith::new(store, SaveResult).into_store();
    /// # }
    /// ```
    pub fn into_store(self) -> Intercepted<PgStore, Self> {
        Intercepted::new(Arc::new(self.store.clone()), self)
    }
}

#[async_trait]
impl<W: CompletionWrites> Intercept for CompleteWith<W> {
    async fn complete(
        &self,
        _inner: &dyn TaskStore,
        lease: Lease,
        response: Response,
    ) -> Result<Fenced<Task>> {
        let attempt = lease.attempt();
        let mut tx = self.store.pool().begin().await.map_err(Error::storage)?;
        let outcome = self.store.on(&mut tx).complete(lease, response).await?;
        // Rejected: dropping `tx` rolls back; the completion wrote nothing either.
        if let Fenced::Accepted(task) = &outcome {
            // The task row stays locked until the commit: nothing can take
            // the task over between the fenced check and these writes.
            self.writes.write(&self.store, &mut tx, task, attempt).await?;
            if let Some(channel) = &self.channel {
                // Queued by the server and delivered on COMMIT, never before.
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(channel)
                    .bind(task.id.to_string())
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::storage)?;
            }
            tx.commit().await.map_err(Error::storage)?;
            self.writes.committed(task);
        }
        Ok(outcome)
    }
}

/// One `LISTEN` connection on `channel`, fanned out to every waiter of this
/// process ([`SavedEvents`](crate::runtime::SavedEvents)): what a long-poll
/// waits on for a [`CompleteWith::notify`] commit. Returns once it listens
/// (no commit after that is missed), with the task forwarding until `stop`.
/// A payload is a task id; a lost connection reconnects and wakes every
/// waiter ([`SavedEvents::resync`](crate::runtime::SavedEvents::resync)): a
/// notification only means "read the store again".
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
/// use taskfence::runtime::Stop;
/// let stop = Stop::new();
/// let (events, listening) = taskfence::postgres::listen_saved(&pool, "taskfence_result_saved", stop.clone()).await?;
/// let mut waiter = events.subscribe(); // then read the task, then wait
/// # Ok(()) }
/// ```
#[cfg(feature = "runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
pub async fn listen_saved(
    pool: &sqlx::PgPool,
    channel: &str,
    stop: crate::runtime::Stop,
) -> std::result::Result<(crate::runtime::SavedEvents, tokio::task::JoinHandle<()>), sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    let events = crate::runtime::SavedEvents::new();
    let announce = events.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.requested() => break,
                received = listener.try_recv() => match received {
                    Ok(Some(n)) => match n.payload().parse::<crate::TaskId>() {
                        Ok(id) => announce.saved(id),
                        Err(_) => tracing::warn!(payload = n.payload(), "ignored a malformed notification"),
                    },
                    // The connection dropped; the next try_recv reconnects and re-LISTENs.
                    Ok(None) => announce.resync(),
                    Err(error) => {
                        tracing::warn!(%error, "LISTEN connection failed; retrying");
                        announce.resync();
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                },
            }
        }
    });
    Ok((events, task))
}

/// `options` whose every connection has `schema` as its `search_path`, the
/// schema created first if missing: the service's unqualified SQL, its
/// migrations and sqlx's `_sqlx_migrations` all land there, beside
/// taskfence's own schema, on every connection (a startup parameter, not a
/// `SET`: it holds for the session and costs no round trip).
///
/// Why checked before created: `CREATE SCHEMA IF NOT EXISTS` needs the
/// CREATE privilege on the database even when the schema exists, which a
/// least-privilege role given a pre-created schema lacks. An advisory lock
/// serializes replicas starting at once (two concurrent creations can
/// collide on the catalog's unique index).
///
/// ```no_run
/// # async fn f() -> Result<(), sqlx::Error> {
/// use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
/// let options: PgConnectOptions = "postgres://app@db/chat".parse()?;
/// let options = taskfence::postgres::app_schema(options, "chat").await?;
/// let pool = PgPoolOptions::new().connect_with(options).await?;
/// # Ok(()) }
/// ```
pub async fn app_schema(
    options: PgConnectOptions,
    schema: &str,
) -> std::result::Result<PgConnectOptions, sqlx::Error> {
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    let mut conn = options.connect().await?;
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("taskfence.app-schema.{schema}"))
        .execute(&mut *tx)
        .await?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(&mut *tx)
        .await?;
    if !exists {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {quoted}")))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    conn.close().await?;
    Ok(options.options([("search_path", quoted.as_str())]))
}
