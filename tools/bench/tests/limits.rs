//! The `--limits` mode in miniature (`--limits --quick`): every store has a
//! row for each worker count and each shape of tasks whose figures parse,
//! the ratios to the tasks naming no limit are printed, and the database
//! files' directory is gone afterwards. Figures are not asserted: speed
//! belongs in the benchmark, not in a test.

mod common;

use common::{cells, number};

use std::process::Command;

#[test]
fn limits_mode_reports_every_store_and_shape() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL must name a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test");
    let run = Command::new(env!("CARGO_BIN_EXE_taskfence-bench"))
        .args(["--limits", "--quick", "--database-url", &url])
        .output()
        .expect("run the harness");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the harness failed:\n{stderr}");
    let md = String::from_utf8_lossy(&run.stdout);
    let section = md
        .split("## What deciding limits costs")
        .nth(1)
        .unwrap_or_else(|| panic!("no limits section in:\n{md}"));
    for store in ["PgStore", "SqliteStore", "MemoryStore"] {
        for workers in ["1", "8", "32"] {
            let prefix = format!("| {store} | {workers} | ");
            // The cost table's rows (the fairness table's have three cells).
            let rows: Vec<&str> = section
                .lines()
                .filter(|l| l.starts_with(&prefix) && cells(l).len() == 8)
                .collect();
            assert_eq!(rows.len(), 4, "four shapes for {prefix} in:\n{section}");
            for row in rows {
                let c = cells(row);
                assert_eq!(c.len(), 8, "eight columns in {row:?}");
                for cell in &c[3..7] {
                    number(cell, row);
                }
                if store == "PgStore" {
                    number(c[7], row);
                } else {
                    assert_eq!(c[7], "–", "{row:?}");
                }
            }
            let plain = section
                .lines()
                .find(|l| l.starts_with(&format!("{prefix}no limit |")))
                .unwrap_or_else(|| panic!("no plain row for {prefix}"));
            assert_eq!(cells(plain)[6], "1.00×", "the baseline is itself: {plain:?}");
        }
    }
    let fairness = section
        .split("| store | started before the lone key's task, keyed | the same, without keys |")
        .nth(1)
        .unwrap_or_else(|| panic!("no fairness table in:\n{section}"));
    for store in ["PgStore", "SqliteStore", "MemoryStore"] {
        let row = fairness
            .lines()
            .find(|l| l.starts_with(&format!("| {store} | ")))
            .unwrap_or_else(|| panic!("no fairness row for {store}"));
        let c = cells(row);
        assert_eq!(c.len(), 3, "{row:?}");
        for cell in &c[1..] {
            let started: u64 = cell
                .parse()
                .unwrap_or_else(|_| panic!("count {cell:?} in {row:?}"));
            assert!(started <= 1_000, "{row:?}");
        }
    }
    let dirs: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[bench] created directory "))
        .collect();
    assert_eq!(dirs.len(), 1, "one directory for the files:\n{stderr}");
    assert!(!std::path::Path::new(dirs[0]).exists(), "{} left behind", dirs[0]);
}
