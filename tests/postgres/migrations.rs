//! The embedded migrations coexist with the host application's own
//! `sqlx::migrate!` in one database, in either order, and concurrent
//! migrators apply each file once.

use crate::common;

use common::TempDatabase;
use sqlx::{PgPool, Row};
use taskfence::wire::Stamp;
use taskfence::{InputHash, NewTask, PgStore, RequestKey, TaskStore};

static HOST: sqlx::migrate::Migrator = sqlx::migrate!("tests/host_migrations");

async fn versions(pool: &PgPool, table: &str) -> Vec<i64> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} ORDER BY version"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The versions of the files in `migrations/` (`0001_….sql` → 1), each of
/// which the embedded runner must have applied once.
fn embedded_versions() -> Vec<i64> {
    let mut versions: Vec<i64> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .expect("migrations/")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("UTF-8 name")
        })
        .filter(|name| name.ends_with(".sql"))
        .map(|name| name[..4].parse().expect("a numbered migration"))
        .collect();
    versions.sort_unstable();
    assert!(!versions.is_empty());
    versions
}

/// Both histories are separate and complete, both sets of tables work
/// together, and running either migrator again changes nothing.
async fn assert_coexist(pool: &PgPool) {
    assert_eq!(
        versions(pool, "public._sqlx_migrations").await,
        [20260101000000, 20260102000000],
        "the host's history holds only the host's migrations"
    );
    assert_eq!(
        versions(pool, "taskfence.taskfence_migrations").await,
        embedded_versions()
    );

    let store = PgStore::new(pool.clone());
    let mut tx = pool.begin().await.unwrap();
    let task = store
        .on(&mut tx)
        .submit(NewTask::new(
            RequestKey::new("u", "chat.reply", "k"),
            InputHash::of(["m-1"]),
        ))
        .await
        .unwrap()
        .into_task();
    sqlx::query("INSERT INTO messages (id, body, task_id) VALUES (1, 'hello', $1)")
        .bind(task.id.as_uuid())
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(store.get(task.id).await.unwrap().is_some());

    HOST.run(pool)
        .await
        .expect("host migrations again: nothing to do");
    store
        .migrate()
        .await
        .expect("taskfence migrations again: nothing to do");
    assert_eq!(versions(pool, "public._sqlx_migrations").await.len(), 2);
    assert_eq!(
        versions(pool, "taskfence.taskfence_migrations").await,
        embedded_versions()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_migrations_first_then_taskfence() {
    let db = TempDatabase::create().await;
    let pool = db.pool(4).await;
    HOST.run(&pool).await.unwrap();
    taskfence::postgres::migrate(&pool).await.unwrap();
    assert_coexist(&pool).await;
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taskfence_first_then_host_migrations() {
    let db = TempDatabase::create().await;
    let pool = db.pool(4).await;
    taskfence::postgres::migrate(&pool).await.unwrap();
    HOST.run(&pool).await.unwrap();
    assert_coexist(&pool).await;
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrators_apply_each_file_once() {
    let db = TempDatabase::create().await;
    let pool = db.pool(10).await;
    let runs = taskfence::testing::race(8, |_| {
        let pool = pool.clone();
        async move { taskfence::postgres::migrate(&pool).await }
    })
    .await;
    assert!(runs.iter().all(Result::is_ok), "{runs:?}");
    assert_eq!(
        versions(&pool, "taskfence.taskfence_migrations").await,
        embedded_versions()
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_migration_that_changed_is_refused() {
    let f = common::fixture().await;
    let pool = f.pg_store().pool();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{}\".taskfence_migrations SET checksum = '\\x00' WHERE version = 1",
        f.schema()
    )))
    .execute(pool)
    .await
    .unwrap();
    let err = f.pg_store().migrate().await.expect_err("checksum mismatch");
    assert!(err.to_string().contains("checksum"), "{err}");
    assert!(matches!(err, taskfence::Error::Migration(_)), "{err:?}");
    assert!(!err.is_retryable(), "a changed migration stays changed");
}

/// The runner taskfence had before sqlx 0.9 kept its history in a table of
/// the same name and another shape (`checksum` = SHA-256 of the file,
/// `applied_at`): the migrator converts it once, applies nothing again, and
/// refuses a history whose recorded file has changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_from_the_runner_before_sqlx_is_converted_once() {
    let f = common::fixture().await;
    let pool = f.pg_store().pool();
    let history = format!("\"{}\".taskfence_migrations", f.schema());
    let old_shape = |checksum: &str| {
        format!(
            "DROP TABLE {history};
             CREATE TABLE {history} (version bigint PRIMARY KEY, description text NOT NULL,
                                     checksum bytea NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
             INSERT INTO {history} (version, description, checksum) VALUES {}",
            embedded_versions()
                .iter()
                .map(|v| format!("({v}, 'file {v}', {checksum})"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    // The old runner's checksum of each file, computed by the server from the files' text.
    let files: Vec<String> = embedded_versions()
        .iter()
        .map(|v| {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
            let name = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .starts_with(&format!("{v:04}_"))
                })
                .unwrap();
            std::fs::read_to_string(name).unwrap()
        })
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(old_shape("'\\x00'")))
        .execute(pool)
        .await
        .unwrap();
    for (v, text) in embedded_versions().iter().zip(&files) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {history} SET checksum = sha256(convert_to($1, 'UTF8')) WHERE version = $2"
        )))
        .bind(text)
        .bind(v)
        .execute(pool)
        .await
        .unwrap();
    }
    f.pg_store()
        .migrate()
        .await
        .expect("the old history is converted");
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns
         WHERE table_schema = $1 AND table_name = 'taskfence_migrations' ORDER BY column_name",
    )
    .bind(f.schema())
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        columns.contains(&"success".to_owned()),
        "sqlx's shape: {columns:?}"
    );
    assert_eq!(
        versions(pool, &history).await,
        embedded_versions(),
        "nothing applied twice"
    );
    f.pg_store().migrate().await.expect("and then nothing to do");
    assert!(
        f.pg_store()
            .get(taskfence::TaskId::new())
            .await
            .unwrap()
            .is_none()
    );

    // The same history with a file recorded under other contents: refused, kept.
    sqlx::raw_sql(sqlx::AssertSqlSafe(old_shape("'\\x00'")))
        .execute(pool)
        .await
        .unwrap();
    let err = f.pg_store().migrate().await.expect_err("a changed file");
    assert!(
        matches!(err, taskfence::Error::Migration(_)) && !err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(
        versions(pool, &history).await,
        embedded_versions(),
        "the old history stays"
    );
}

/// A store whose schema was never migrated, or is older than the library,
/// answers a typed error that names the fix, and it is not retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_old_schema_is_a_typed_error_naming_the_fix() {
    let db = TempDatabase::create().await;
    let pool = db.pool(2).await;
    let store = PgStore::builder(pool.clone())
        .schema("never_migrated")
        .build()
        .unwrap();
    let new = || NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]));
    let err = store.submit(new()).await.expect_err("no schema");
    assert!(matches!(err, taskfence::Error::NotMigrated { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("taskfence migrate"), "{err}");

    store.migrate().await.unwrap();
    // Hide the latest migration from the history: the schema now reads as one behind.
    let history = |sql: &'static str| sqlx::query(sql).execute(&pool);
    history("UPDATE never_migrated.taskfence_migrations SET version = -version WHERE version = (SELECT max(version) FROM never_migrated.taskfence_migrations)")
        .await
        .unwrap();
    let behind = PgStore::builder(pool.clone())
        .schema("never_migrated")
        .build()
        .unwrap();
    let err = behind.submit(new()).await.expect_err("one migration behind");
    let latest = *embedded_versions().last().unwrap();
    assert!(
        matches!(&err, taskfence::Error::NotMigrated { detail, .. } if detail.contains(&format!("at migration {}", latest - 1))),
        "{err:?}"
    );
    history("UPDATE never_migrated.taskfence_migrations SET version = -version WHERE version < 0")
        .await
        .unwrap();
    assert!(
        behind.submit(new()).await.unwrap().is_created(),
        "current again, the same store works"
    );
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_name_that_needs_quoting_is_refused() {
    // Never connects: the name is checked before any SQL is built.
    let pool = PgPool::connect_lazy("postgres://postgres@127.0.0.1:1/none").unwrap();
    for bad in [
        "",
        "Tasks",
        "1abc",
        "a-b",
        "a\"b",
        "x; DROP TABLE y",
        &"a".repeat(64),
    ] {
        let err = PgStore::builder(pool.clone()).schema(bad).build().expect_err(bad);
        assert!(
            matches!(
                err,
                taskfence::Error::InvalidInput(taskfence::error::InvalidInput::NotAnIdentifier { .. })
            ),
            "{bad}: {err:?}"
        );
    }
    pool.close().await;
}

/// A task written before migration 0003 has no `budget_started_at` (the
/// migration adds the column without a backfill): it reads as its first
/// budget, from `created_at`, and its deadline still counts from submission.
#[tokio::test]
async fn a_task_from_before_the_budget_columns_keeps_its_first_budget() {
    use std::time::Duration;
    use taskfence::testing::{Fixture, PgFixture};
    use taskfence::{Claim, ClaimRequest, RetryPolicy};

    let f = PgFixture::new().await;
    let store = f.pg_store();
    let policy = RetryPolicy::default().deadline(Duration::from_secs(60));
    let task = store
        .submit(common::new_task("old").policy(policy))
        .await
        .unwrap()
        .into_task();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.tasks SET budget_started_at = NULL WHERE id = $1",
        f.schema()
    )))
    .bind(task.id.as_uuid())
    .execute(store.pool())
    .await
    .unwrap();

    let read = store.get(task.id).await.unwrap().unwrap();
    assert_eq!((read.budget_base, read.budget_started_at), (0, read.created_at));
    assert_eq!(read, task, "reads exactly as it was written");
    f.advance(Duration::from_secs(61)).await;
    assert!(
        matches!(
            store
                .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
                .await
                .unwrap(),
            Claim::Failed(_)
        ),
        "the deadline still counts from submission"
    );
}

/// Runs one migration file's SQL in the fixture's schema, as the runner does.
async fn apply(f: &taskfence::testing::PgFixture, sql: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SET LOCAL search_path TO \"{}\"; {sql} COMMIT;",
        f.schema()
    )))
    .execute(f.pg_store().pool())
    .await
    .unwrap();
}

/// Migration 0005 moves each running attempt from the `attempts` journal into
/// its task row; a task whose latest attempt stays in the journal (it ended
/// before the migration) keeps it there, and both go on as usual. The rows
/// are put in the pre-0005 shape by hand, then the migration's SQL runs.
#[tokio::test]
async fn attempts_from_before_the_row_columns_carry_on() {
    use std::time::Duration;
    use taskfence::store::AttemptOutcome;
    use taskfence::testing::{Fixture, PgFixture};
    use taskfence::{Failure, Response};

    let f = PgFixture::new().await;
    let store = f.pg_store();
    let s = format!("\"{}\"", f.schema());
    let running = store
        .submit(common::new_task("running"))
        .await
        .unwrap()
        .into_task();
    let running_lease = common::acquire(store, running.id, "w").await;
    let retried = store
        .submit(common::new_task("retried"))
        .await
        .unwrap()
        .into_task();
    let first = common::acquire(store, retried.id, "w").await;
    store
        .fail(first, Failure::retryable("timeout"))
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let before = [
        store.attempts(running.id).await.unwrap(),
        store.attempts(retried.id).await.unwrap(),
    ];

    // The pre-0005 shape: every attempt in the journal (a running one with no
    // finish), none in the rows.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {s}.attempts (task_id, number, id, worker, started_at, finished_at, outcome,
                                   operation_id, error)
         SELECT id, version, attempt_id, attempt_worker, attempt_started_at, attempt_finished_at,
                attempt_outcome, attempt_operation_id, attempt_error
         FROM {s}.tasks WHERE attempt_id IS NOT NULL;
         UPDATE {s}.tasks SET attempt_id = NULL, attempt_worker = NULL, attempt_started_at = NULL,
             attempt_finished_at = NULL, attempt_outcome = NULL, attempt_operation_id = NULL,
             attempt_error = NULL;"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    apply(&f, include_str!("../../migrations/0005_latest_attempt.sql")).await;

    let in_journal = format!("SELECT count(*) FROM {s}.attempts WHERE task_id = $1");
    let journal = |id: taskfence::TaskId| {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(in_journal.as_str()))
            .bind(id.as_uuid())
            .fetch_one(store.pool())
    };
    assert_eq!(journal(running.id).await.unwrap(), 0, "the running attempt moved");
    assert_eq!(journal(retried.id).await.unwrap(), 1, "the ended one stayed");
    assert_eq!(store.attempts(running.id).await.unwrap(), before[0]);
    assert_eq!(store.attempts(retried.id).await.unwrap(), before[1]);

    // Both carry on: the moved attempt completes; the retried task is claimed
    // and completed, its earlier attempt still in the journal.
    store
        .complete(running_lease, Response::new(b"one".to_vec()))
        .await
        .unwrap()
        .into_result()
        .unwrap();
    f.advance(Duration::from_secs(3600)).await;
    let second = common::acquire(store, retried.id, "w").await;
    store
        .complete(second, Response::new(b"two".to_vec()))
        .await
        .unwrap()
        .into_result()
        .unwrap();
    let outcomes = |attempts: Vec<taskfence::store::Attempt>| {
        attempts
            .into_iter()
            .map(|a| (a.number, a.outcome))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        outcomes(store.attempts(running.id).await.unwrap()),
        [(1, AttemptOutcome::Completed)]
    );
    assert_eq!(
        outcomes(store.attempts(retried.id).await.unwrap()),
        [
            (
                1,
                AttemptOutcome::Failed(taskfence::policy::FailureKind::Retryable)
            ),
            (2, AttemptOutcome::Completed)
        ]
    );
}

/// Migration 0006 keys `handoffs` by task: the handoffs of the pre-0006 shape
/// (primary key on `id`, a second index on `task_id`) carry over, one index
/// replaces the two, and the dispatcher publishes them once.
#[tokio::test]
async fn handoffs_from_before_the_task_key_carry_on() {
    use taskfence::testing::PgFixture;

    let f = PgFixture::new().await;
    let store = f.pg_store();
    let s = format!("\"{}\"", f.schema());
    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        ids.push(store.submit(common::new_task(key)).await.unwrap().into_task().id);
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {s}.handoffs DROP CONSTRAINT handoffs_pkey;
         ALTER TABLE {s}.handoffs ADD CONSTRAINT handoffs_pkey PRIMARY KEY (id);
         CREATE INDEX handoffs_task ON {s}.handoffs (task_id);"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    apply(&f, include_str!("../../migrations/0006_handoffs_by_task.sql")).await;

    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'handoffs'
         ORDER BY indexname",
    )
    .bind(f.schema())
    .fetch_all(store.pool())
    .await
    .unwrap();
    let names: Vec<&str> = indexes.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["handoffs_pkey", "handoffs_unpublished"], "{indexes:?}");
    assert!(indexes[0].1.ends_with("(task_id, id)"), "{indexes:?}");
    assert_eq!(f.count("handoffs").await, 3);

    let published = std::sync::Mutex::new(Vec::new());
    let round = store
        .dispatch(100, |stamp: Stamp| {
            let id = stamp.task_id;
            published.lock().unwrap().push(id);
            std::future::ready(Ok::<_, std::io::Error>(()))
        })
        .await
        .unwrap();
    assert_eq!(round.published, ids);
    assert_eq!(*published.lock().unwrap(), ids);
    let again = store
        .dispatch(100, |_| std::future::ready(Ok::<_, std::io::Error>(())))
        .await
        .unwrap();
    assert!(again.published.is_empty(), "marked published: {again:?}");
}

/// `migration_status` on a schema one migration behind (`migrate_to`): the
/// last one pending with the rest applied, read without writing; a version
/// the library does not have is refused and applies nothing; then
/// `migrate` brings it up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_status_on_a_schema_one_migration_behind() {
    use taskfence::postgres::MigrationState;
    let db = TempDatabase::create().await;
    let pool = db.pool(2).await;
    let store = PgStore::builder(pool.clone()).schema("staged").build().unwrap();
    let all = embedded_versions();
    let (last, behind) = (all[all.len() - 1], all[all.len() - 2]);

    let fresh = store.migration_status().await.unwrap();
    assert_eq!(
        fresh.pending().count(),
        all.len(),
        "a missing schema: all pending"
    );
    assert!(!fresh.is_up_to_date());

    let err = store.migrate_to(last + 1).await.expect_err("no such migration");
    assert!(matches!(err, taskfence::Error::InvalidInput(_)), "{err:?}");
    store.migrate_to(behind).await.unwrap();
    assert_eq!(
        versions(&pool, "staged.taskfence_migrations").await,
        all[..all.len() - 1]
    );

    let status = store.migration_status().await.unwrap();
    assert_eq!(status.schema, "staged");
    assert_eq!(status.pending().map(|m| m.version).collect::<Vec<_>>(), [last]);
    assert_eq!(status.applied().count(), all.len() - 1);
    assert!(status.check().is_ok() && !status.is_up_to_date() && !status.old_history);
    assert!(
        status
            .pending_sql()
            .contains(status.migrations.last().unwrap().sql)
    );
    let notes = |v: i64| status.migrations.iter().find(|m| m.version == v).unwrap().notes;
    assert!(matches!(
        notes(5)[0],
        taskfence::postgres::UpgradeNote::StopOldWorkers { .. }
    ));
    assert!(!notes(3)[0].statements().is_empty());
    assert!(matches!(
        status.migrations[0].state,
        MigrationState::Applied { .. }
    ));
    assert_eq!(
        versions(&pool, "staged.taskfence_migrations").await,
        all[..all.len() - 1],
        "reading the status writes nothing"
    );

    // A store of this library refuses the schema until it is migrated.
    let new = NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"]));
    assert!(matches!(
        store.submit(new).await,
        Err(taskfence::Error::NotMigrated { .. })
    ));
    store.migrate().await.unwrap();
    let done = store.migration_status().await.unwrap();
    assert!(done.is_up_to_date() && done.pending().next().is_none());
    assert!(done.pending_sql().contains("up to date"));
    pool.close().await;
}
