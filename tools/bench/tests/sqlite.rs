//! The `--sqlite` mode in miniature (`--sqlite --quick`): every system has a
//! row at 1, 8 and 32 workers whose figures parse, the per-round ratios and
//! the targets are printed, and nothing is left behind (the database files'
//! directory, the PostgreSQL schemas). Figures are not asserted: speed
//! belongs in the benchmark, not in a test.

mod common;

use common::{cells, number};

use std::process::Command;

const SYSTEMS: [&str; 4] = [
    "taskfence consumer, SqliteStore",
    "apalis-sqlite",
    "taskfence consumer, MemoryStore",
    "taskfence consumer, PgStore",
];

#[test]
fn sqlite_mode_reports_every_system_and_leaves_nothing_behind() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL must name a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test");
    let run = Command::new(env!("CARGO_BIN_EXE_taskfence-bench"))
        .args(["--sqlite", "--quick", "--database-url", &url])
        .output()
        .expect("run the harness");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the harness failed:\n{stderr}");
    let md = String::from_utf8_lossy(&run.stdout);
    let section = md
        .split("## SQLite: taskfence beside apalis-sqlite")
        .nth(1)
        .unwrap_or_else(|| panic!("no SQLite section in:\n{md}"));

    let apalis = cfg!(feature = "apalis");
    for workers in ["1", "8", "32"] {
        for system in SYSTEMS {
            let prefix = format!("| {workers} | {system} |");
            let row = section
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no row {prefix} in:\n{section}"));
            let c = cells(row);
            assert_eq!(c.len(), 7, "seven columns in {row:?}");
            if system == "apalis-sqlite" && !apalis {
                assert!(c[2].starts_with("not built"), "{row:?}");
                continue;
            }
            number(c[2], row);
            number(c[4], row);
            if apalis {
                number(c[3], row);
                number(c[5], row);
            }
            if system == "taskfence consumer, MemoryStore" {
                assert_eq!(c[6], "–", "MemoryStore writes no transactions: {row:?}");
            } else {
                number(c[6], row);
            }
        }
        let prefix = format!("| {workers} | ");
        let rounds = section
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .find(|l| cells(l).len() == 3)
            .unwrap_or_else(|| panic!("no per-round ratios at {workers} workers in:\n{section}"));
        if apalis {
            number(cells(rounds)[1], rounds);
            number(cells(rounds)[2], rounds);
        }
    }
    for target in [
        "| SqliteStore processing at 8 workers ≥ 1.5× apalis-sqlite |",
        "| SqliteStore enqueue at 8 workers ≥ 1.5× apalis-sqlite |",
        "| SqliteStore processing at 32 workers ≥ 1.5× apalis-sqlite |",
        "| SqliteStore enqueue at 32 workers ≥ 1.5× apalis-sqlite |",
    ] {
        let row = section
            .lines()
            .find(|l| l.starts_with(target))
            .unwrap_or_else(|| panic!("no target row {target}"));
        let verdict = if apalis {
            ["| met |", "| missed |"].iter().any(|v| row.ends_with(v))
        } else {
            row.ends_with("| not measured |")
        };
        assert!(verdict, "target verdict in {row:?}");
    }

    // The files' directory and the PostgreSQL schemas the run announced are gone.
    let dirs: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[bench] created directory "))
        .collect();
    assert_eq!(dirs.len(), 1, "one directory for the files:\n{stderr}");
    assert!(!std::path::Path::new(dirs[0]).exists(), "{} left behind", dirs[0]);
    let schemas: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[bench] created schemas "))
        .flat_map(|names| names.split(" and ").map(str::to_owned))
        .collect();
    assert_eq!(
        schemas.len(),
        6,
        "PgStore's schemas, two per worker count:\n{stderr}"
    );
    let left: i64 = tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let left = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)")
            .bind(&schemas)
            .fetch_one(&pool)
            .await
            .expect("count schemas");
        pool.close().await;
        left
    });
    assert_eq!(left, 0, "schemas left behind: {schemas:?}");
}
