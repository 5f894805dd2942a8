//! Every statement stays index-driven with a tiny plan cost on a large table:
//! no sequential scan, and a total cost far below `jit_above_cost`, so no
//! call ever pays for JIT compilation.
//!
//! The table holds `TASKFENCE_PLAN_ROWS` tasks (default 100 000; the figures
//! in docs/POSTGRES.md come from a manual run with 1 000 000:
//! `TASKFENCE_PLAN_ROWS=1000000 cargo test --all-features --test postgres plans:: -- --nocapture`).

use crate::common;

use sqlx::postgres::PgArguments;
use sqlx::postgres::types::PgInterval;
use sqlx::query::Query;
use sqlx::{Postgres, Row};
use uuid::Uuid;

/// Plans must stay this far below `jit_above_cost` (100 000 by default).
const MAX_COST: f64 = 1_000.0;

/// Counting every task reads every entry of one index (an index-only scan):
/// its cost grows with the table, so it is only held below `jit_above_cost`.
const WHOLE_TABLE: &[&str] = &["counts"];

/// The capped counts read up to their cap (10 000 here) of index entries per
/// status whatever the table's size: more than a page, so they are only held
/// below `jit_above_cost`.
const CAPPED: &[&str] = &["counts_up_to", "counts_up_to_scope"];

/// Each operation's queue reads the pending and running tasks' entries
/// (the backlog: 20 % of the rows here), never the finished tasks' however
/// many are kept: held below `jit_above_cost`, and its plan must select by
/// status.
const BACKLOG: &[&str] = &["depth"];

/// `claim_next`'s scan while tasks naming limits wait ranks a bounded
/// window of due tasks (eight pages of each kind): more than a page, so it
/// is only held below `jit_above_cost`, whatever the backlog.
const WINDOWED: &[&str] = &["needing_worker_limited"];
/// A listing by submission window filters the id-ordered walk (there is no
/// index on `created_at`): the planner prices it as if matches were spread
/// evenly over the table (rows ÷ matches × page), so its estimate grows with
/// the table however near the window is; it is held below `jit_above_cost`.
const FILTERED_WALK: &[&str] = &["list_created"];

/// The read-only operator statements, also run with `EXPLAIN ANALYZE` for
/// the measured timings in docs/POSTGRES.md (printed, never asserted).
const OPERATOR_READS: &[&str] = &[
    "list",
    "list_oldest",
    "list_status",
    "list_status_oldest",
    "list_scope",
    "list_operation",
    "list_created",
    "counts",
    "counts_scope",
    "counts_up_to",
    "counts_up_to_scope",
    "story",
    "stranded",
    "depth",
];

fn rows() -> i64 {
    std::env::var("TASKFENCE_PLAN_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Fills the fixture's schema: 70 % completed (1 % of them past retention),
/// 10 % pending (half backing off, 1 % of those due; the others never
/// claimed), 10 % running (1 % with an expired lease), 10 % failed; one
/// attempt per claimed task, one handoff per task published a second after
/// submission, 0.1 % of the handoffs unpublished; one reopening per failed
/// task (as if every one had been retried once before). Task `i` of `n` was
/// submitted `n - i` seconds ago, its id a UUID v7 of that instant (ids in
/// submission order, as `TaskId::new` makes them).
async fn fill(pool: &sqlx::PgPool, s: &str, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {s}.tasks (id, scope, operation, request_key, input_hash, payload, status, version,
             max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, on_ambiguous,
             lease_until, not_before, response, created_at, finished_at, expires_at, budget_started_at)
         SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
                 || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
                'scope-' || (i % 1000), 'chat.reply', 'key-' || i,
                sha256(i::text::bytea), '\\x'::bytea, st,
                CASE WHEN st = 'pending' AND i % 20 <> 7 THEN 0 ELSE 1 END,
                5, 1000000000, 300000000000, 2, 0.2, 'retry',
                CASE WHEN st = 'running' THEN now() + CASE WHEN i % 1000 = 8 THEN '-1 hour' ELSE '1 hour' END::interval END,
                CASE WHEN st = 'pending' AND i % 20 = 7 THEN now() + CASE WHEN i % 2000 = 7 THEN '-1 hour' ELSE '1 hour' END::interval END,
                CASE WHEN st = 'completed' THEN '\\x6f6b'::bytea END,
                at,
                CASE WHEN st IN ('completed', 'failed') THEN now() END,
                now() + CASE WHEN i % 100 = 0 THEN '-1 day' ELSE '7 days' END::interval,
                at
         FROM (SELECT i, CASE WHEN i % 10 < 7 THEN 'completed' WHEN i % 10 = 7 THEN 'pending'
                              WHEN i % 10 = 8 THEN 'running' ELSE 'failed' END AS st,
                      now() - ($1 - i) * interval '1 second' AS at
               FROM generate_series(1, $1) AS i) AS g"
    )))
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {s}.attempts (task_id, number, id, worker, started_at, finished_at, outcome)
         SELECT id, 1, gen_random_uuid(), 'w', created_at, finished_at,
                CASE status WHEN 'running' THEN 'running' WHEN 'completed' THEN 'completed' ELSE 'expired' END
         FROM {s}.tasks WHERE version > 0;
         INSERT INTO {s}.handoffs (task_id, created_at, published_at)
         SELECT id, created_at, CASE WHEN random() < 0.999 THEN created_at + interval '1 second' END
         FROM {s}.tasks;
         INSERT INTO {s}.reopenings (task_id, number, at, by, reason, from_status, version)
         SELECT id, 1, created_at, 'ops', 'quota raised', 'failed', 1 FROM {s}.tasks
         WHERE status = 'failed';"
    )))
    .execute(pool)
    .await
    .unwrap();
    // As autovacuum leaves a table: statistics and the visibility map (which
    // index-only scans rely on). VACUUM runs outside a transaction, one at a time.
    for table in ["tasks", "attempts", "handoffs", "reopenings"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {s}.{table}")))
            .execute(pool)
            .await
            .unwrap();
    }
    // A transaction of another test that was open during the fill keeps its
    // rows from counting as visible to all, and VACUUM then leaves their pages
    // out of the visibility map: vacuum `tasks` again (a few times at most)
    // until every page is in it, as on a quiet server.
    for _ in 0..20 {
        let (pages, visible): (i32, i32) =
            sqlx::query_as("SELECT relpages, relallvisible FROM pg_class WHERE oid = $1::regclass")
                .bind(format!("{s}.tasks"))
                .fetch_one(pool)
                .await
                .unwrap();
        if visible >= pages {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM {s}.tasks")))
            .execute(pool)
            .await
            .unwrap();
    }
}

fn interval(secs: i64) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: secs * 1_000_000,
    }
}

/// Each statement's parameter types and plausible arguments, for `PREPARE`
/// and `EXPLAIN EXECUTE` (the generic plan).
fn prepared(name: &str, id: Uuid) -> (&'static str, String) {
    let id = format!("'{id}'");
    match name {
        "submit" => (
            "uuid, text, text, text, bytea, bytea, int4, int8, int8, float8, float8, int8, text, interval, interval, text, bool, text, \
             text, int4, text",
            "gen_random_uuid(), 'scope-1', 'chat.reply', 'key-new', sha256('x'), '', 5, 1000000000, \
             300000000000, 2, 0.2, NULL, 'retry', NULL, '1 day', 'current_assignment', true, NULL, \
             'conversation-7', 1, 'provider'"
                .into(),
        ),
        "submit_many" => (
            "uuid[], text[], text[], text[], bytea[], bytea[], int4[], int8[], int8[], float8[], float8[], int8[], \
             text[], interval[], interval[], text[], bool[], text[]",
            "ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['scope-1', 'scope-1'], \
             ARRAY['chat.reply', 'chat.reply'], ARRAY['key-new', 'key-1'], ARRAY[sha256('x'), sha256('y')], \
             ARRAY[''::bytea, ''::bytea], ARRAY[5, 5], ARRAY[1000000000, 1000000000]::int8[], \
             ARRAY[300000000000, 300000000000]::int8[], ARRAY[2, 2]::float8[], ARRAY[0.2, 0.2]::float8[], \
             ARRAY[NULL, NULL]::int8[], ARRAY['retry', 'retry'], ARRAY[NULL, NULL]::interval[], \
             ARRAY['1 day', '1 day']::interval[], ARRAY['current_assignment', 'current_assignment'], \
             ARRAY[true, true], ARRAY[NULL, NULL]::text[]"
                .into(),
        ),
        "get" | "read" | "attempts" | "effects" => ("uuid", id),
        "find" => ("text, text, text", "'scope-1', 'chat.reply', 'key-1'".into()),
        "claim" | "claim_fresh" => (
            "uuid, uuid, interval, text, text, text, bool",
            format!(
                "{id}, gen_random_uuid(), '30 s', 'w', 'attempts exhausted', 'deadline exhausted', false"
            ),
        ),
        "lock_key" | "key_running" | "key_waiting" => ("text", "'conversation-7'".into()),
        "lock_bucket" | "bucket_defined" => ("text", "'provider'".into()),
        "key_load" => ("text, timestamptz", "'conversation-7', now()".into()),
        "define_bucket" => (
            "text, int8, int8, int8, int8, int8",
            "'provider', 500, 60000000000, 50, 120000000, 5880000000".into(),
        ),
        "set_schedule" => ("text, int8", "'provider', 1700000000000000000".into()),
        "buckets" | "store_now" => ("", String::new()),
        "needing_worker_limited" => ("int8, text[], text[]", "40, '{}', '{}'".into()),
        "read_lease" => ("uuid, int8", format!("{id}, 1")),
        "renew" => (
            "uuid, int8, interval, uuid",
            format!("{id}, 1, '30 s', gen_random_uuid()"),
        ),
        "complete" | "complete_current" => (
            "uuid, int8, bytea, uuid",
            format!("{id}, 1, 'answer', gen_random_uuid()"),
        ),
        "fail" => (
            "uuid, int8, text, text, text, interval, text, uuid",
            format!(
                "{id}, 1, NULL, '429', 'deadline exhausted: 429', '2 s', 'failed_retryable', gen_random_uuid()"
            ),
        ),
        "release" => (
            "uuid, int8, text, int8, uuid",
            format!("{id}, 1, 'returned_unstarted', 1, gen_random_uuid()"),
        ),
        "cancel" => ("uuid, text", format!("{id}, 'user deleted it'")),
        "record_operation" => (
            "uuid, int8, text, uuid",
            format!("{id}, 1, 'op-1', gen_random_uuid()"),
        ),
        "fence" => ("uuid, int8, uuid", format!("{id}, 1, gen_random_uuid()")),
        "effect_read" => (
            "uuid, int8, text, uuid",
            format!("{id}, 1, 'notify-user', gen_random_uuid()"),
        ),
        "effect_write" => (
            "uuid, int8, text, text, int4, text, text, int4, timestamptz, timestamptz, timestamptz, text, int8, uuid",
            format!(
                "{id}, 1, 'notify-user', 'intended', 1, NULL, NULL, 0, now(), now(), NULL, NULL, NULL, gen_random_uuid()"
            ),
        ),
        "due" | "purge_expired" | "claim_handoffs" => ("int8", "100".into()),
        "mark_published" => ("int8[]", "'{1,2,3}'".into()),
        "claim_many" => (
            "uuid[], uuid[], interval, text, text, text",
            format!(
                "ARRAY[{id}::uuid, gen_random_uuid()], ARRAY[gen_random_uuid(), gen_random_uuid()], '30 s', 'w', \
                 'attempts exhausted', 'deadline exhausted'"
            ),
        ),
        "complete_many" | "complete_many_current" => (
            "uuid[], int8[], bytea[], uuid[]",
            format!(
                "ARRAY[{id}::uuid, gen_random_uuid()], ARRAY[1, 1], ARRAY['answer'::bytea, 'other'::bytea], \
                 ARRAY[gen_random_uuid(), gen_random_uuid()]"
            ),
        ),
        "read_many" => (
            "uuid[], int8[]",
            format!("ARRAY[{id}::uuid, gen_random_uuid()], ARRAY[1, 1]"),
        ),
        "claim_next" => (
            "int8, uuid[], interval, text, text, text, text[], text[]",
            format!(
                "16, ARRAY[{}], '30 s', 'w', 'attempts exhausted', 'deadline exhausted', '{{}}', '{{}}'",
                vec!["gen_random_uuid()"; 16].join(", ")
            ),
        ),
        "renew_many" => (
            "uuid[], int8[], interval, uuid[]",
            format!(
                "ARRAY[{id}::uuid, gen_random_uuid()], ARRAY[1, 1], '30 s', ARRAY[gen_random_uuid(), gen_random_uuid()]"
            ),
        ),
        "reopen" => (
            "uuid, text, text, bool, int4, int8, int8, float8, float8, int8, text, int4",
            format!(
                "{id}, 'ops', 'quota raised', true, 5, 1000000000, 300000000000, 2, 0.2, NULL, 'retry', NULL"
            ),
        ),
        "redispatch" => ("uuid[]", format!("ARRAY[{id}::uuid, gen_random_uuid()]")),
        "list" => ("uuid, int8", format!("'{}', 51", Uuid::max())),
        "list_oldest" => ("uuid, int8", format!("'{}', 51", Uuid::nil())),
        "list_status" => ("text, uuid, int8", format!("'failed', '{}', 51", Uuid::max())),
        "list_status_oldest" => ("text, uuid, int8", format!("'pending', '{}', 2", Uuid::nil())),
        "list_scope" => ("text, uuid, int8", format!("'scope-7', '{}', 51", Uuid::max())),
        "list_operation" => ("text, uuid, int8", format!("'chat.reply', '{}', 51", Uuid::max())),
        "list_created" => (
            "timestamptz, timestamptz, uuid, int8",
            format!("now() - interval '1 hour', now(), '{}', 51", Uuid::max()),
        ),
        "counts" => ("", String::new()),
        "counts_scope" => ("text", "'scope-7'".into()),
        "counts_up_to" => ("int8", "10000".into()),
        "counts_up_to_scope" => ("text, int8", "'scope-7', 10000".into()),
        "story" => ("uuid", id),
        "stranded" => ("interval, int8", "'1 hour', 50".into()),
        "depth" => ("", String::new()),
        other => panic!("no parameters for {other}"),
    }
}

/// The total cost on the first line of a text plan.
fn total_cost(name: &str, plan: &[String]) -> f64 {
    plan[0]
        .split("cost=")
        .nth(1)
        .and_then(|c| c.split("..").nth(1))
        .and_then(|c| c.split(' ').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no cost in {:?}", plan[0]))
}

/// Binds plausible values for each statement's parameters.
fn bind<'q>(name: &str, q: Query<'q, Postgres, PgArguments>, id: Uuid) -> Query<'q, Postgres, PgArguments> {
    match name {
        "submit" => q
            .bind(Uuid::now_v7())
            .bind("scope-1")
            .bind("chat.reply")
            .bind("key-new")
            .bind(vec![7u8; 32])
            .bind(Vec::<u8>::new())
            .bind(5_i32)
            .bind(1_000_000_000_i64)
            .bind(300_000_000_000_i64)
            .bind(2.0_f64)
            .bind(0.2_f64)
            .bind(None::<i64>)
            .bind("retry")
            .bind(None::<PgInterval>)
            .bind(interval(86_400))
            .bind("current_assignment")
            .bind(true)
            .bind(None::<String>)
            .bind("conversation-7")
            .bind(1_i32)
            .bind("provider"),
        "submit_many" => q
            .bind(vec![Uuid::now_v7(), Uuid::now_v7()])
            .bind(vec!["scope-1", "scope-1"])
            .bind(vec!["chat.reply", "chat.reply"])
            .bind(vec!["key-new", "key-1"])
            .bind(vec![vec![7u8; 32], vec![8u8; 32]])
            .bind(vec![Vec::<u8>::new(), Vec::new()])
            .bind(vec![5_i32, 5])
            .bind(vec![1_000_000_000_i64, 1_000_000_000])
            .bind(vec![300_000_000_000_i64, 300_000_000_000])
            .bind(vec![2.0_f64, 2.0])
            .bind(vec![0.2_f64, 0.2])
            .bind(vec![None::<i64>, None])
            .bind(vec!["retry", "retry"])
            .bind(vec![None::<PgInterval>, None])
            .bind(vec![interval(86_400), interval(86_400)])
            .bind(vec!["current_assignment", "current_assignment"])
            .bind(vec![true, true])
            .bind(vec![None::<String>, None]),
        "get" | "read" | "attempts" | "effects" => q.bind(id),
        "find" => q.bind("scope-1").bind("chat.reply").bind("key-1"),
        "claim" | "claim_fresh" => q
            .bind(id)
            .bind(Uuid::now_v7())
            .bind(interval(30))
            .bind("w")
            .bind("attempts exhausted")
            .bind("deadline exhausted")
            .bind(false),
        "lock_key" | "key_running" | "key_waiting" => q.bind("conversation-7"),
        "lock_bucket" | "bucket_defined" => q.bind("provider"),
        "key_load" => q.bind("conversation-7").bind(time::OffsetDateTime::now_utc()),
        "define_bucket" => q
            .bind("provider")
            .bind(500_i64)
            .bind(60_000_000_000_i64)
            .bind(50_i64)
            .bind(120_000_000_i64)
            .bind(5_880_000_000_i64),
        "set_schedule" => q.bind("provider").bind(1_700_000_000_000_000_000_i64),
        "buckets" | "store_now" => q,
        "needing_worker_limited" => q
            .bind(40_i64)
            .bind(Vec::<String>::new())
            .bind(Vec::<String>::new()),
        "read_lease" => q.bind(id).bind(1_i64),
        "renew" => q.bind(id).bind(1_i64).bind(interval(30)).bind(Uuid::now_v7()),
        "complete" | "complete_current" => q
            .bind(id)
            .bind(1_i64)
            .bind(b"answer".to_vec())
            .bind(Uuid::now_v7()),
        "fail" => q
            .bind(id)
            .bind(1_i64)
            .bind(None::<String>)
            .bind("429")
            .bind("deadline exhausted: 429")
            .bind(interval(2))
            .bind("failed_retryable")
            .bind(Uuid::now_v7()),
        "release" => q
            .bind(id)
            .bind(1_i64)
            .bind("returned_unstarted")
            .bind(1_i64)
            .bind(Uuid::now_v7()),
        "cancel" => q.bind(id).bind("user deleted it"),
        "record_operation" => q.bind(id).bind(1_i64).bind("op-1").bind(Uuid::now_v7()),
        "fence" => q.bind(id).bind(1_i64).bind(Uuid::now_v7()),
        "effect_read" => q.bind(id).bind(1_i64).bind("notify-user").bind(Uuid::now_v7()),
        "effect_write" => q
            .bind(id)
            .bind(1_i64)
            .bind("notify-user")
            .bind("intended")
            .bind(1_i32)
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(0_i32)
            .bind(time::OffsetDateTime::now_utc())
            .bind(time::OffsetDateTime::now_utc())
            .bind(None::<time::OffsetDateTime>)
            .bind(None::<String>)
            .bind(None::<i64>)
            .bind(Uuid::now_v7()),
        "due" | "purge_expired" | "claim_handoffs" => q.bind(100_i64),
        "mark_published" => q.bind(vec![1_i64, 2, 3]),
        "claim_many" => q
            .bind(vec![id, Uuid::now_v7()])
            .bind(vec![Uuid::now_v7(), Uuid::now_v7()])
            .bind(interval(30))
            .bind("w")
            .bind("attempts exhausted")
            .bind("deadline exhausted"),
        "complete_many" | "complete_many_current" => q
            .bind(vec![id, Uuid::now_v7()])
            .bind(vec![1_i64, 1])
            .bind(vec![b"answer".to_vec(), b"other".to_vec()])
            .bind(vec![Uuid::now_v7(), Uuid::now_v7()]),
        "read_many" => q.bind(vec![id, Uuid::now_v7()]).bind(vec![1_i64, 1]),
        "claim_next" => q
            .bind(16_i64)
            .bind((0..16).map(|_| Uuid::now_v7()).collect::<Vec<_>>())
            .bind(interval(30))
            .bind("w")
            .bind("attempts exhausted")
            .bind("deadline exhausted")
            .bind(Vec::<String>::new())
            .bind(Vec::<String>::new()),
        "renew_many" => q
            .bind(vec![id, Uuid::now_v7()])
            .bind(vec![1_i64, 1])
            .bind(interval(30))
            .bind(vec![Uuid::now_v7(), Uuid::now_v7()]),
        "reopen" => q
            .bind(id)
            .bind("ops")
            .bind("quota raised")
            .bind(true)
            .bind(5_i32)
            .bind(1_000_000_000_i64)
            .bind(300_000_000_000_i64)
            .bind(2.0_f64)
            .bind(0.2_f64)
            .bind(None::<i64>)
            .bind("retry")
            .bind(None::<i32>),
        "redispatch" => q.bind(vec![id, Uuid::now_v7()]),
        "list" => q.bind(Uuid::max()).bind(51_i64),
        "list_oldest" => q.bind(Uuid::nil()).bind(51_i64),
        "list_status" => q.bind("failed").bind(Uuid::max()).bind(51_i64),
        "list_status_oldest" => q.bind("pending").bind(Uuid::nil()).bind(2_i64),
        "list_scope" => q.bind("scope-7").bind(Uuid::max()).bind(51_i64),
        "list_operation" => q.bind("chat.reply").bind(Uuid::max()).bind(51_i64),
        "list_created" => {
            let now = time::OffsetDateTime::now_utc();
            q.bind(now - time::Duration::hours(1))
                .bind(now)
                .bind(Uuid::max())
                .bind(51_i64)
        }
        "counts" => q,
        "counts_scope" => q.bind("scope-7"),
        "counts_up_to" => q.bind(10_000_i64),
        "counts_up_to_scope" => q.bind("scope-7").bind(10_000_i64),
        "story" => q.bind(id),
        "stranded" => q.bind(interval(3600)).bind(50_i64),
        "depth" => q,
        other => panic!("no binds for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_is_index_driven_and_cheap_on_a_large_table() {
    let f = common::fixture().await;
    let pool = f.pg_store().pool();
    let s = format!("\"{}\"", f.schema());
    let n = rows();
    fill(pool, &s, n).await;
    let running: Uuid = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {s}.tasks WHERE status = 'running' LIMIT 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    let jit_above: f64 = sqlx::query("SELECT current_setting('jit_above_cost')::float8")
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0);
    assert!(
        MAX_COST * 10.0 <= jit_above,
        "the bound is well below jit_above_cost"
    );

    let mut conn = pool.acquire().await.unwrap();
    for (name, sql) in f.pg_store().statements() {
        let explain = format!("EXPLAIN {sql}");
        let plan: Vec<String> = bind(name, sqlx::query(sqlx::AssertSqlSafe(explain.as_str())), running)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("EXPLAIN {name}: {e}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        println!("-- {name} ({n} tasks)\n{}\n", plan.join("\n"));
        let total = total_cost(name, &plan);
        if BACKLOG.contains(&name) {
            assert!(
                plan.iter()
                    .any(|line| line.contains("Index Cond") && line.contains("status")),
                "{name}: reads by status, not the whole table:\n{}",
                plan.join("\n")
            );
        }
        if WHOLE_TABLE.contains(&name)
            || FILTERED_WALK.contains(&name)
            || CAPPED.contains(&name)
            || BACKLOG.contains(&name)
            || WINDOWED.contains(&name)
        {
            assert!(
                total < jit_above,
                "{name}: total cost {total} at {n} rows reaches jit_above_cost"
            );
        } else {
            assert!(total < MAX_COST, "{name}: total cost {total} at {n} rows");
        }
        assert!(
            !plan.iter().any(|line| line.contains("Seq Scan")),
            "{name}: sequential scan at {n} rows:\n{}",
            plan.join("\n")
        );
    }
}

/// sqlx runs every statement as a named prepared statement; after five runs
/// PostgreSQL may switch it to a generic plan (parameters unknown at planning,
/// `LIMIT $1` estimated, not known). Those plans must be index-driven and
/// below `jit_above_cost` too, or a long-lived connection would start
/// JIT-compiling its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_plans_of_prepared_statements_stay_index_driven_and_below_jit() {
    let f = common::fixture().await;
    let pool = f.pg_store().pool();
    let s = format!("\"{}\"", f.schema());
    let n = rows();
    fill(pool, &s, n).await;
    let running: Uuid = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {s}.tasks WHERE status = 'running' LIMIT 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let jit_above: f64 = sqlx::query("SELECT current_setting('jit_above_cost')::float8")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    for (name, sql) in f.pg_store().statements() {
        let (types, args) = prepared(name, running);
        let (types, args) = if types.is_empty() {
            (String::new(), String::new())
        } else {
            (format!("({types})"), format!("({args})"))
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PREPARE tf_{name} {types} AS {sql}")))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("PREPARE {name}: {e}"));
        let plan: Vec<String> =
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE tf_{name} {args}")))
                .fetch_all(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("EXPLAIN EXECUTE {name}: {e}"))
                .iter()
                .map(|r| r.get(0))
                .collect();
        println!("-- generic {name} ({n} tasks)\n{}\n", plan.join("\n"));
        let total = total_cost(name, &plan);
        assert!(
            total < jit_above,
            "{name}: generic plan cost {total} reaches jit_above_cost"
        );
        assert!(
            !plan.iter().any(|line| line.contains("Seq Scan")),
            "{name}: sequential scan in the generic plan at {n} rows"
        );
    }
}

/// The operator's read-only statements, executed: their plans with the
/// measured time and buffers, printed for docs/POSTGRES.md (no timing is
/// asserted), and their plans still free of sequential scans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reads_measured() {
    let f = common::fixture().await;
    let pool = f.pg_store().pool();
    let s = format!("\"{}\"", f.schema());
    let n = rows();
    fill(pool, &s, n).await;
    let failed: Uuid = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {s}.tasks WHERE status = 'failed' LIMIT 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    let mut conn = pool.acquire().await.unwrap();
    for (name, sql) in f.pg_store().statements() {
        if !OPERATOR_READS.contains(&name) {
            continue;
        }
        let explain = format!("EXPLAIN (ANALYZE, BUFFERS) {sql}");
        let plan: Vec<String> = bind(name, sqlx::query(sqlx::AssertSqlSafe(explain.as_str())), failed)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("EXPLAIN ANALYZE {name}: {e}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        println!("-- analyzed {name} ({n} tasks)\n{}\n", plan.join("\n"));
        assert!(
            !plan.iter().any(|line| line.contains("Seq Scan")),
            "{name}: sequential scan at {n} rows"
        );
    }
}
