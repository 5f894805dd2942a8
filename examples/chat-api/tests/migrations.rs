//! Start-up migrations: taskfence's history in its own schema, the app's
//! `_sqlx_migrations` in the app schema, and starting again (or two replicas at
//! once) applies nothing twice and keeps the data.

mod support;

use chat_api::MIGRATOR;
use chat_api::Mode;
use sqlx::Row;
use support::{ALICE, TestDb, TestService};

/// `(version, success, checksum)` of the app's history and the versions of
/// taskfence's, each read from the schema it must be in.
async fn histories(db: &TestDb) -> (Vec<(i64, bool, Vec<u8>)>, Vec<i64>) {
    let pool = db.fixture.pg_store().pool();
    let app = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT version, success, checksum FROM \"{}\"._sqlx_migrations ORDER BY version",
        db.app_schema.name()
    )))
    .fetch_all(pool)
    .await
    .expect("the app's history is in the app schema")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect();
    let taskfence = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".taskfence_migrations ORDER BY version",
        db.fixture.schema()
    )))
    .fetch_all(pool)
    .await
    .expect("taskfence's history is in its schema");
    (app, taskfence)
}

/// Whether `schema.table` exists.
async fn exists(db: &TestDb, schema: &str, table: &str) -> bool {
    sqlx::query_scalar::<_, Option<String>>("SELECT to_regclass(format('%I.%I', $1::text, $2::text))::text")
        .bind(schema)
        .bind(table)
        .fetch_one(db.fixture.pg_store().pool())
        .await
        .expect("to_regclass")
        .is_some()
}

/// The app's history holds exactly the embedded migrations, all applied.
fn assert_app_history_complete(app: &[(i64, bool, Vec<u8>)]) {
    let expected: Vec<(i64, bool, Vec<u8>)> = MIGRATOR
        .iter()
        .map(|m| (m.version, true, m.checksum.to_vec()))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(app, expected, "each app migration applied once, unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_twice_applies_nothing_again_and_keeps_the_data() {
    let db = TestDb::new().await;
    let first = TestService::start(&db, Mode::ApiOnly).await;
    let sent = first.api().send(ALICE, "conv-1", Some("send-1"), "hello").await;
    assert_eq!(sent.status, 201);
    first.stop().await;

    let after_first = histories(&db).await;
    assert_app_history_complete(&after_first.0);
    assert!(!after_first.1.is_empty(), "taskfence's migrations applied");

    // The two histories stay apart: neither tool's table is in the other's schema.
    let (app, tf) = (db.app_schema.name(), db.fixture.schema());
    assert!(exists(&db, app, "_sqlx_migrations").await);
    assert!(exists(&db, tf, "taskfence_migrations").await);
    assert!(!exists(&db, tf, "_sqlx_migrations").await);
    assert!(!exists(&db, app, "taskfence_migrations").await);
    assert!(exists(&db, app, "messages").await && !exists(&db, tf, "messages").await);
    assert!(exists(&db, tf, "tasks").await && !exists(&db, app, "tasks").await);

    // A restart on the same database: both migrators find nothing to do.
    let second = TestService::start(&db, Mode::ApiOnly).await;
    assert_eq!(histories(&db).await, after_first, "nothing applied twice");
    let again = second.api().send(ALICE, "conv-1", Some("send-1"), "hello").await;
    assert_eq!(
        (again.status, again.replayed()),
        (201, true),
        "the first start's rows survived the second"
    );
    assert_eq!(again.body, sent.body);
    second.stop().await;
    assert_eq!(db.count("messages").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_at_once_apply_each_migration_once() {
    let db = TestDb::new().await;
    let (a, b, c) = tokio::join!(
        TestService::start(&db, Mode::ApiOnly),
        TestService::start(&db, Mode::WorkerOnly),
        TestService::start(&db, Mode::Both),
    );
    let (app, taskfence) = histories(&db).await;
    assert_app_history_complete(&app);
    assert!(!taskfence.is_empty());
    let mut unique = taskfence.clone();
    unique.dedup();
    assert_eq!(unique, taskfence, "each taskfence migration recorded once");
    for service in [a, b, c] {
        service.stop().await;
    }
}
