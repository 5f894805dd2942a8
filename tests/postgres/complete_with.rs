//! `taskfence::postgres::{CompleteWith, FollowUp, listen_saved, app_schema}`:
//! a service's own rows written in the completion's transaction — exactly
//! when the completion is accepted — the follow-up task submitted there
//! once per task, the commit announced to `listen_saved`, and the service's
//! tables in a schema of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgConnection;
use taskfence::postgres::{CompleteWith, CompletionWrites, FollowUp};
use taskfence::runtime::Stop;
use taskfence::{Error, PgStore, Response, Task, TaskStore};

use crate::common::{self, new_task};

/// Writes one row per completion into `<schema>.results`, or refuses.
struct SaveResult {
    table: String,
    refuse: bool,
}

#[async_trait::async_trait]
impl CompletionWrites for SaveResult {
    async fn write(
        &self,
        _: &PgStore,
        tx: &mut PgConnection,
        task: &Task,
        attempt: u32,
    ) -> taskfence::Result<()> {
        if self.refuse {
            return Err(Error::storage(std::io::Error::other("refused by the service")));
        }
        let text = task
            .response
            .as_ref()
            .and_then(|r| r.as_str())
            .unwrap_or_default();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (task_id, text, attempt) VALUES ($1, $2, $3)",
            self.table
        )))
        .bind(task.id.as_uuid())
        .bind(text)
        .bind(i32::try_from(attempt).unwrap())
        .execute(tx)
        .await
        .map_err(Error::storage)?;
        Ok(())
    }
}

async fn results_table(store: &PgStore) -> String {
    let table = format!("\"{}\".results", store.schema());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (task_id uuid PRIMARY KEY, text text NOT NULL, attempt int NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    table
}

async fn rows(store: &PgStore, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_the_follow_up_and_the_notification_commit_with_an_accepted_completion_only() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let table = results_table(&store).await;
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    let follow_up = FollowUp::new("notify", |done: &Task| Ok(done.id.to_string().into_bytes()))
        .without_handoff()
        .after_commit(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
    let channel = format!("{}_saved", store.schema());
    let wrapped = CompleteWith::new(
        store.clone(),
        (
            SaveResult {
                table: table.clone(),
                refuse: false,
            },
            Some(follow_up.clone()),
        ),
    )
    .notify(channel.clone())
    .into_store();
    let stop = Stop::new();
    let (events, listening) = taskfence::postgres::listen_saved(store.pool(), &channel, stop.clone())
        .await
        .unwrap();
    let mut waiter = events.subscribe();

    let task = wrapped.submit(new_task("k1")).await.unwrap().into_task();
    let lease = common::acquire(&wrapped, task.id, "w1").await;
    // A second worker takes the task over after the first one's lease is lost.
    let stale = lease.clone();
    assert!(wrapped.release(lease).await.unwrap().is_accepted());
    let lease = common::acquire(&wrapped, task.id, "w2").await;
    assert!(
        !wrapped
            .complete(stale, Response::from("stale"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(
        rows(&store, &table).await,
        0,
        "a refused completion writes no row"
    );

    let done = wrapped.complete(lease, Response::from("answer")).await.unwrap();
    assert!(done.is_accepted());
    assert_eq!(rows(&store, &table).await, 1);
    let attempt: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT attempt FROM {table}")))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(attempt, 2, "the accepted lease's attempt");
    let done = store.get(task.id).await.unwrap().unwrap();
    let next = follow_up.task_for(&done).unwrap();
    let submitted = store.find(&next.key).await.unwrap().expect("the follow-up task");
    assert_eq!(submitted.payload, task.id.to_string().into_bytes());
    assert_eq!(woken.load(Ordering::SeqCst), 1, "after_commit ran once");
    tokio::time::timeout(Duration::from_secs(5), waiter.changed(task.id))
        .await
        .expect("the commit is announced");
    stop.request();
    listening.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_rolls_the_completion_back() {
    let f = common::fixture().await;
    let store = f.pg_store().clone();
    let table = results_table(&store).await;
    let wrapped = CompleteWith::new(
        store.clone(),
        SaveResult {
            table: table.clone(),
            refuse: true,
        },
    )
    .into_store();
    let task = wrapped.submit(new_task("k1")).await.unwrap().into_task();
    let lease = common::acquire(&wrapped, task.id, "w").await;
    assert!(wrapped.complete(lease, Response::from("answer")).await.is_err());
    let after = store.get(task.id).await.unwrap().unwrap();
    assert_ne!(
        after.status,
        taskfence::Status::Completed,
        "rolled back with the service's write"
    );
    assert_eq!(rows(&store, &table).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_schema_creates_the_schema_once_and_sets_every_connections_search_path() {
    let f = common::fixture().await;
    let schema = format!("{}_app", f.schema());
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    // Replicas starting at once: each call creates or finds it.
    let (a, b) = tokio::join!(
        taskfence::postgres::app_schema(options.clone(), &schema),
        taskfence::postgres::app_schema(options.clone(), &schema),
    );
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_with(a.unwrap())
        .await
        .unwrap();
    drop(b.unwrap());
    let first: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(first, schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
}

/// `config::connect_pool`: the app schema first in every connection's
/// `search_path`, the session named, a bad URL refused as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_pool_puts_the_app_schema_first_and_names_the_session() {
    let f = common::fixture().await;
    let schema = format!("{}_pool", f.schema());
    let url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = taskfence::config::connect_pool(&url, Some(&schema), 2, "chat-api")
        .await
        .unwrap();
    let (current, name): (String, String) =
        sqlx::query_as("SELECT current_schema(), current_setting('application_name')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((current.as_str(), name.as_str()), (schema.as_str(), "chat-api"));
    let plain = taskfence::config::connect_pool(&url, None, 1, "w").await.unwrap();
    let current: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(&plain)
        .await
        .unwrap();
    assert_ne!(current, schema, "no app schema: the server's search_path");
    let bad = taskfence::config::connect_pool("not a url", None, 1, "w").await;
    assert!(matches!(bad, Err(taskfence::config::ConnectError::Url(_))));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
}
