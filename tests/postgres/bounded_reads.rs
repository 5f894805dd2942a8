//! The operator's reads are bounded on PostgreSQL: each runs under its
//! statement timeout (a read stuck behind a lock answers
//! `Error::ReadTimeout`, it does not hang), and the plans of the listings
//! and capped counts on a fresh schema are driven by an index, load no
//! payloads or responses, and stop at their `LIMIT`.

use std::time::{Duration, Instant};

use sqlx::Row;
use taskfence::inspect::{Inspect, TaskQuery};
use taskfence::testing::new_task;
use taskfence::{Error, PgStore, TaskStore};

use crate::common;

/// One read of the store, its answer dropped.
type Read<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = taskfence::Result<()>> + Send + 'a>>;

/// A store on `f`'s schema whose reads may run `limit`.
fn store_with_timeout(f: &taskfence::testing::PgFixture, limit: Duration) -> PgStore {
    PgStore::builder(f.pg_store().pool().clone())
        .schema(f.schema())
        .read_timeout(limit)
        .build()
        .unwrap()
}

/// A read stuck behind another transaction's lock on `tasks` is cancelled at
/// the store's read timeout and says so; the connection serves the next read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_its_timeout_is_cancelled_and_typed() {
    let f = common::fixture().await;
    let store = store_with_timeout(&f, Duration::from_millis(300));
    store.submit(new_task("a")).await.unwrap();
    // Another session holds the table: every read of it waits.
    let mut locker = f.pg_store().pool().begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE \"{}\".tasks IN ACCESS EXCLUSIVE MODE",
        f.schema()
    )))
    .execute(&mut *locker)
    .await
    .unwrap();
    let reads: [(&str, Read<'_>); 3] = [
        (
            "list",
            Box::pin(async { store.list(&TaskQuery::new()).await.map(drop) }),
        ),
        (
            "counts_up_to",
            Box::pin(async { store.counts_up_to(None, 100).await.map(drop) }),
        ),
        ("counts", Box::pin(async { store.counts(None).await.map(drop) })),
    ];
    for (name, read) in reads {
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .unwrap_or_else(|_| panic!("{name}: still waiting after 10 s: no statement timeout"));
        assert!(
            matches!(answer, Err(Error::ReadTimeout { limit }) if limit == Duration::from_millis(300)),
            "{name}: {answer:?}"
        );
        assert!(answer.unwrap_err().is_retryable());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name}: {:?}",
            started.elapsed()
        );
    }
    locker.rollback().await.unwrap();
    assert_eq!(store.list(&TaskQuery::new()).await.unwrap().tasks.len(), 1);
    // The timeout was the read's own (SET LOCAL): the pool's sessions keep theirs.
    let setting: String = sqlx::query("SHOW statement_timeout")
        .fetch_one(f.pg_store().pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "0");
}

/// `EXPLAIN VERBOSE` of `sql` with the session's sequential and bitmap scans
/// priced out (`enable_seqscan`, `enable_bitmapscan` off: on a fresh, empty
/// schema they are the cheapest way to read nothing), so the plan shows the
/// index walk the planner takes on a large table — and a sequential scan,
/// or a sort of every match, only when no index can serve the query.
async fn plan(conn: &mut sqlx::PgConnection, sql: &str, args: &str, types: &str) -> Vec<String> {
    sqlx::raw_sql("SET enable_seqscan = off; SET enable_bitmapscan = off; DEALLOCATE ALL")
        .execute(&mut *conn)
        .await
        .unwrap();
    let types = if types.is_empty() {
        String::new()
    } else {
        format!("({types})")
    };
    let args = if args.is_empty() {
        String::new()
    } else {
        format!("({args})")
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE bounded {types} AS {sql}")))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("PREPARE {sql}: {e}"));
    let plan = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (VERBOSE) EXECUTE bounded {args}"
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
    .iter()
    .map(|r| r.get::<String, _>(0))
    .collect();
    sqlx::raw_sql("DEALLOCATE bounded")
        .execute(&mut *conn)
        .await
        .unwrap();
    plan
}

/// The listing statements by their filters: each filter alone is an index
/// condition walked in id order (no `Filter:` line re-checking rows, no
/// Sort, no sequential scan), and no listing (the stranded one included)
/// reads `payload` or `response`; each capped count scans under its `LIMIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_and_capped_counts_are_index_driven_and_bounded() {
    let f = common::fixture().await;
    let statements = f.pg_store().statements();
    let sql = |name: &str| {
        statements
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no statement {name}"))
            .1
            .to_owned()
    };
    let mut conn = f.pg_store().pool().acquire().await.unwrap();
    let max = uuid::Uuid::max();
    for (name, types, args, filtered) in [
        ("list", "uuid, int8", format!("'{max}', 51"), None),
        (
            "list_status",
            "text, uuid, int8",
            format!("'failed', '{max}', 51"),
            Some("status"),
        ),
        (
            "list_scope",
            "text, uuid, int8",
            format!("'scope-7', '{max}', 51"),
            Some("scope"),
        ),
        (
            "list_operation",
            "text, uuid, int8",
            format!("'chat.reply', '{max}', 51"),
            Some("operation"),
        ),
    ] {
        let plan = plan(&mut conn, &sql(name), &args, types).await;
        let text = plan.join("\n");
        assert!(!text.contains("Seq Scan"), "{name}: a sequential scan:\n{text}");
        assert!(text.contains("Limit"), "{name}: no LIMIT:\n{text}");
        // In id order straight from the index: a Sort would read every
        // matching row before returning the first.
        assert!(!text.contains("Sort"), "{name}: sorts its matches:\n{text}");
        if let Some(column) = filtered {
            assert!(
                plan.iter()
                    .any(|l| l.contains("Index Cond") && l.contains(column)),
                "{name}: {column} is not an index condition:\n{text}"
            );
            assert!(
                !plan
                    .iter()
                    .any(|l| l.trim_start().starts_with("Filter:") && l.contains(column)),
                "{name}: rows are re-checked for {column} after the index:\n{text}"
            );
        }
        for line in plan.iter().filter(|l| l.trim_start().starts_with("Output:")) {
            assert!(
                !line.contains("payload") && !line.contains("response"),
                "{name}: the listing reads payloads or responses:\n{text}"
            );
        }
    }
    // The stranded listing (the overview's tile, the stranded page) is a
    // listing too: summary rows under its LIMIT.
    let stranded = plan(
        &mut conn,
        &sql("stranded"),
        "'10 minutes', 1000",
        "interval, int8",
    )
    .await;
    let text = stranded.join("\n");
    assert!(text.contains("Limit"), "stranded: no LIMIT:\n{text}");
    for line in stranded.iter().filter(|l| l.trim_start().starts_with("Output:")) {
        assert!(
            !line.contains("payload") && !line.contains("response"),
            "stranded: the listing reads payloads or responses:\n{text}"
        );
    }
    // The overview's counts: every count scans under a LIMIT (its cap), from an index.
    for (name, types, args) in [
        ("counts_up_to", "int8", "10000".to_owned()),
        ("counts_up_to_scope", "text, int8", "'scope-7', 10000".to_owned()),
    ] {
        let plan = plan(&mut conn, &sql(name), &args, types).await;
        let text = plan.join("\n");
        assert!(!text.contains("Seq Scan"), "{name}: a sequential scan:\n{text}");
        let scans = plan
            .iter()
            .filter(|l| {
                (l.contains("Index Scan") || l.contains("Index Only Scan") || l.contains("Bitmap Heap Scan"))
                    && !l.contains("Bitmap Index Scan")
            })
            .count();
        let limits = plan.iter().filter(|l| l.contains("->  Limit")).count();
        assert!(
            scans >= 1 && limits >= scans,
            "{name}: a count without a LIMIT over its scan:\n{text}"
        );
    }
}
