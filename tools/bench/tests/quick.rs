//! The CI smoke run: the harness in `--quick` mode against `DATABASE_URL`
//! finishes and writes its report and chart. Figures are not asserted (speed
//! belongs in the benchmark, not in a test); the structure is.

use std::process::Command;

#[test]
fn quick_mode_writes_every_section_and_the_chart() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL must name a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test");
    let unique = format!(
        "taskfence-bench-quick-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    );
    let out = std::env::temp_dir().join(unique);
    let run = Command::new(env!("CARGO_BIN_EXE_taskfence-bench"))
        .args(["--quick", "--database-url", &url, "--out"])
        .arg(&out)
        .output()
        .expect("run the harness");
    assert!(
        run.status.success(),
        "the harness failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let md = std::fs::read_to_string(out.join("bench-results.md")).expect("bench-results.md written");
    for section in [
        "## Round trips per operation",
        "## Lifecycle throughput: ours vs the raw-SQL ceiling",
        "## Completion latency: the textbook locking transaction vs ours",
        "## 32 workers racing for one task",
        "## Latency as the table grows",
        "## MemoryStore",
    ] {
        assert!(md.contains(section), "missing section {section:?} in:\n{md}");
    }
    for workers in ["| 1 |", "| 8 |", "| 32 |"] {
        assert!(md.contains(workers), "no throughput row for {workers} workers");
    }
    for op in [
        "| submit |",
        "| claim |",
        "| complete |",
        "| textbook completion |",
    ] {
        assert!(md.contains(op), "no round-trip row {op}");
    }
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("# taskfence benchmark results"),
        "the report is printed too"
    );

    let svg = std::fs::read_to_string(out.join("throughput.svg")).expect("throughput.svg written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<polyline").count(),
        2,
        "one line for ours, one for the ceiling"
    );
    assert_eq!(
        svg.matches("<circle").count(),
        6,
        "a marker per worker count per line"
    );

    // Every schema the run created (it names them on stderr: the store's and
    // the ceiling's) is gone.
    let stderr = String::from_utf8_lossy(&run.stderr);
    let created: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[bench] created schemas "))
        .flat_map(|names| names.split(" and ").map(str::to_owned))
        .collect();
    assert!(
        created.len() >= 12,
        "each section announces its schema:\n{stderr}"
    );
    let left = tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)")
            .bind(&created)
            .fetch_one(&pool)
            .await
            .expect("count schemas");
        pool.close().await;
        left
    });
    assert_eq!(left, 0, "schemas left behind: {created:?}");
    std::fs::remove_dir_all(&out).expect("remove the output directory");
}
