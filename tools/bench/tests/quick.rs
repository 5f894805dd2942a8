//! The CI smoke run: the harness in `--quick` mode against `DATABASE_URL`
//! finishes and writes its report and chart. Figures are not asserted (speed
//! belongs in the benchmark, not in a test); the structure is.

use std::process::Command;

/// The peers section's systems, as the report and the chart name them.
const SYSTEMS: [&str; 9] = [
    "taskfence consumer",
    "taskfence consumer, prefetch 4×",
    "taskfence consumer, NOTIFY",
    "taskfence broker, batched",
    "raw-SQL batched ceiling",
    "apalis-postgres",
    "River (riverqueue), 1 ms cooldown",
    "River (riverqueue), default",
    "awa",
];

/// The peers table: a row per system per worker count whose figures parse
/// (throughputs as numbers, ratios as `1.23×`, the WAL bytes and write
/// transactions per task as numbers), and the targets table.
fn peers_section_has_every_system_and_figures(md: &str) {
    let section = md
        .split("## Peers: enqueue and processing throughput")
        .nth(1)
        .expect("peers section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    for workers in ["1", "8", "32"] {
        for system in SYSTEMS {
            let prefix = format!("| {workers} | {system} |");
            let row = section
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no peers row {prefix} in:\n{section}"));
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 10, "ten columns in {row:?}");
            if system == "apalis-postgres" && !cfg!(feature = "apalis") {
                assert!(cells[2].starts_with("not built"), "{row:?}");
                continue;
            }
            for rate in [cells[2], cells[4]] {
                let v: f64 = rate
                    .parse()
                    .unwrap_or_else(|_| panic!("throughput {rate:?} in {row:?}"));
                assert!(v > 0.0, "throughput {rate:?} in {row:?}");
            }
            for r in [cells[3], cells[5]] {
                let v: f64 = r
                    .strip_suffix('×')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("ratio {r:?} in {row:?}"));
                assert!(v > 0.0, "ratio {r:?} in {row:?}");
            }
            for per_task in [cells[6], cells[7]] {
                let v: f64 = per_task
                    .parse()
                    .unwrap_or_else(|_| panic!("cost per task {per_task:?} in {row:?}"));
                assert!(v > 0.0, "every system writes: {per_task:?} in {row:?}");
            }
            // Index entries and dead tuples: figures where the server has the
            // contrib extensions that count them, "–" where it has not.
            for per_task in [cells[8], cells[9]] {
                assert!(
                    per_task == "–" || per_task.parse::<f64>().is_ok_and(|v| v >= 0.0),
                    "cost per task {per_task:?} in {row:?}"
                );
            }
        }
    }
    for target in [
        "| consumer processing at 8 workers ≥ 1.5× the fastest peer |",
        "| consumer processing at 32 workers ≥ 1.5× the fastest peer |",
        "| enqueue without a handoff at 8 workers ≥ 1.5× the fastest peer |",
        "| consumer processing at 1 workers ≥ 0.8× the batched ceiling |",
    ] {
        let row = section
            .lines()
            .find(|l| l.starts_with(target))
            .unwrap_or_else(|| panic!("no target row {target}"));
        assert!(
            row.ends_with("| met |") || row.ends_with("| missed |"),
            "target verdict in {row:?}"
        );
    }
}

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
        "## Peers: enqueue and processing throughput",
        "## Submit to start on an idle queue",
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
    peers_section_has_every_system_and_figures(&md);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("# taskfence benchmark results"),
        "the report is printed too"
    );

    let svg = std::fs::read_to_string(out.join("throughput.svg")).expect("throughput.svg written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let measured: Vec<&str> = SYSTEMS
        .into_iter()
        .filter(|s| *s != "apalis-postgres" || cfg!(feature = "apalis"))
        .collect();
    assert_eq!(
        svg.matches("<polyline").count(),
        measured.len(),
        "one processing line per measured system"
    );
    for system in &measured {
        assert!(
            svg.contains(&format!("data-series=\"{system}\"")),
            "no line for {system}"
        );
    }
    assert_eq!(
        svg.matches("<circle").count(),
        3 * measured.len(),
        "a marker per worker count per line"
    );

    // Every schema the run created (it names them on stderr: the store's and
    // the ceiling's, River's) is gone, and so is every database (awa's, apalis's).
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
    let databases: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[bench] created database "))
        .map(str::to_owned)
        .collect();
    // awa's, and apalis's when built: one per worker count each.
    let expected = if cfg!(feature = "apalis") { 6 } else { 3 };
    assert_eq!(
        databases.len(),
        expected,
        "one database per worker count for each peer with a fixed schema:\n{stderr}"
    );
    let (left, dbs_left) = tokio::runtime::Runtime::new().expect("runtime").block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)")
            .bind(&created)
            .fetch_one(&pool)
            .await
            .expect("count schemas");
        let dbs_left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = ANY($1)")
            .bind(&databases)
            .fetch_one(&pool)
            .await
            .expect("count databases");
        pool.close().await;
        (left, dbs_left)
    });
    assert_eq!(left, 0, "schemas left behind: {created:?}");
    assert_eq!(dbs_left, 0, "databases left behind: {databases:?}");
    std::fs::remove_dir_all(&out).expect("remove the output directory");
}
