//! `migrate --status`, `--dry-run`, `--print-sql` and `--to` against the real
//! PostgreSQL, on a schema one migration behind: the looking flags change
//! nothing, and bad input is a usage error that writes nothing.

mod common;

use common::{Run, run, taskfence};
use sqlx::Row;
use taskfence::testing::TempSchema;

/// The numbered files in the library's `migrations/`, oldest first.
fn shipped() -> Vec<(i64, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations");
    let mut files: Vec<(i64, String)> = std::fs::read_dir(dir)
        .expect("migrations/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (
                name[..4].parse().expect("numbered"),
                std::fs::read_to_string(&p).expect("read"),
            )
        })
        .collect();
    files.sort();
    files
}

/// The versions in the schema's history, or none when it has no history table.
async fn history(url: &str, schema: &str) -> Vec<i64> {
    let pool = sqlx::PgPool::connect(url).await.expect("connect");
    let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("{schema}.taskfence_migrations"))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    let versions = if exists {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT version FROM {schema}.taskfence_migrations ORDER BY version"
        )))
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    } else {
        Vec::new()
    };
    pool.close().await;
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_dry_run_and_print_sql_on_a_schema_one_migration_behind() {
    let url = taskfence_test_support::database_url().await;
    let schema = TempSchema::new(&url, "taskfence_cli_mig_").await;
    let on = |args: &[&str]| -> Run {
        run(taskfence()
            .args(["--database-url", &url, "--schema", schema.name()])
            .args(args))
    };
    let files = shipped();
    let (last, last_sql) = files.last().cloned().expect("a migration");
    let behind = last - 1;

    // Before anything: every migration pending, and looking created nothing.
    let fresh = on(&["--json", "migrate", "--status"]).json();
    assert_eq!(fresh["up_to_date"], false);
    assert!(
        fresh["migrations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "pending")
    );
    assert!(
        history(&url, schema.name()).await.is_empty(),
        "--status writes nothing"
    );

    // One migration behind.
    let to = on(&["migrate", "--to", &behind.to_string()]);
    assert_eq!(
        to.ok(),
        format!("schema {} is migrated up to {behind:04}\n", schema.name())
    );
    let applied: Vec<i64> = (1..=behind).collect();
    assert_eq!(history(&url, schema.name()).await, applied);

    let status = on(&["migrate", "--status"]);
    let text = status.ok();
    assert!(
        text.starts_with(&format!(
            "schema {}: {behind} of {last} migrations applied, 1 pending\n",
            schema.name()
        )),
        "{text}"
    );
    let line = |version: i64| {
        text.lines()
            .find(|l| l.starts_with(&format!("{version:04} ")))
            .unwrap_or_else(|| panic!("no line for {version:04} in\n{text}"))
    };
    assert!(line(last).contains("pending"), "{text}");
    assert!(line(behind).contains("applied"), "{text}");
    // The notes are on their migrations' lines.
    assert!(line(5).contains("stop the old workers first"), "{text}");
    assert!(line(3).contains("build its indexes concurrently first"), "{text}");

    let json = on(&["--json", "migrate", "--status"]).json();
    let migrations = json["migrations"].as_array().unwrap();
    assert_eq!(migrations.len(), files.len());
    assert_eq!(migrations.last().unwrap()["state"], "pending");
    assert!(migrations.last().unwrap()["applied_at"].is_null());
    let applied_at = migrations[0]["applied_at"].as_str().unwrap();
    time::OffsetDateTime::parse(applied_at, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    assert_eq!(migrations[4]["notes"][0]["kind"], "stop_old_workers");
    assert_eq!(migrations[2]["notes"][0]["kind"], "build_indexes_concurrently");
    assert!(
        migrations[2]["notes"][0]["statements"][0]
            .as_str()
            .unwrap()
            .starts_with("CREATE INDEX CONCURRENTLY")
    );

    // --dry-run: the last one would be applied, and nothing is.
    let dry = on(&["migrate", "--dry-run"]);
    let dry_text = dry.ok();
    assert!(
        dry_text.starts_with(&format!(
            "would apply 1 migration(s) to schema {} (nothing changed):\n",
            schema.name()
        )),
        "{dry_text}"
    );
    assert!(dry_text.contains(&format!("{last:04}")), "{dry_text}");
    let dry_json = on(&["--json", "migrate", "--dry-run"]).json();
    assert_eq!(dry_json["would_apply"].as_array().unwrap().len(), 1);
    assert_eq!(dry_json["would_apply"][0]["version"], last);
    assert_eq!(
        history(&url, schema.name()).await,
        applied,
        "--dry-run writes nothing"
    );

    // --print-sql: the pending file as shipped, on the schema's search_path.
    let sql = on(&["migrate", "--print-sql"]);
    let sql_text = sql.ok();
    assert!(sql_text.contains(&last_sql), "{sql_text}");
    assert!(
        sql_text.contains(&format!("SET search_path TO \"{}\";", schema.name())),
        "{sql_text}"
    );
    let (_, earlier_sql) = &files[files.len() - 2];
    assert!(!sql_text.contains(earlier_sql.as_str()), "only what is pending");
    assert_eq!(
        history(&url, schema.name()).await,
        applied,
        "--print-sql writes nothing"
    );

    // Apply it; then there is nothing left to do or print.
    on(&["migrate"]).ok();
    let all: Vec<i64> = (1..=last).collect();
    assert_eq!(history(&url, schema.name()).await, all);
    assert_eq!(on(&["--json", "migrate", "--status"]).json()["up_to_date"], true);
    assert_eq!(
        on(&["migrate", "--dry-run"]).ok(),
        format!("schema {} is up to date: nothing to apply\n", schema.name())
    );
    assert!(on(&["migrate", "--print-sql"]).ok().contains("up to date"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_migrate_input_is_a_usage_error_and_writes_nothing() {
    let url = taskfence_test_support::database_url().await;
    let schema = TempSchema::new(&url, "taskfence_cli_mig_").await;
    let on = |args: &[&str]| -> Run {
        run(taskfence()
            .args(["--database-url", &url, "--schema", schema.name()])
            .args(args))
    };
    for args in [
        &["migrate", "--status", "--dry-run"][..],
        &["migrate", "--status", "--print-sql"],
        &["migrate", "--status", "--to", "3"],
        &["migrate", "--to", "0"],
        &["migrate", "--to", "three"],
        &["migrate", "--to", "999"],
        &["migrate", "--dry-run", "--to", "999"],
    ] {
        on(args).failed(2);
    }
    assert!(history(&url, schema.name()).await.is_empty(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_migration_is_shown_and_refused() {
    let url = taskfence_test_support::database_url().await;
    let schema = TempSchema::new(&url, "taskfence_cli_mig_").await;
    let on = |args: &[&str]| -> Run {
        run(taskfence()
            .args(["--database-url", &url, "--schema", schema.name()])
            .args(args))
    };
    on(&["migrate", "--to", "2"]).ok();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.taskfence_migrations SET checksum = '\\x00' WHERE version = 1",
        schema.name()
    )))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let status = on(&["migrate", "--status"]);
    let text = status.ok();
    assert!(
        text.lines()
            .any(|l| l.starts_with("0001") && l.contains("CHANGED")),
        "{text}"
    );
    assert!(text.contains("migrate would refuse"), "{text}");
    assert!(
        on(&["migrate", "--dry-run"])
            .failed(1)
            .contains("checksum mismatch")
    );
    on(&["migrate"]).failed(1);
    assert_eq!(history(&url, schema.name()).await, [1, 2], "nothing applied");
}
