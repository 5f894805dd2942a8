//! Scaffolding, not for copying: a short scripted story against
//! `DATABASE_URL` — retried uploads, duplicate deliveries, and a slow worker
//! for v2 finishing after v3 was indexed.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p document-indexing
//! ```
//!
//! It works in two schemas of its own (named after `--schema-prefix` and the
//! process id) and drops them at the end. The story is printed on stdout; logs
//! go to stderr, filtered by `RUST_LOG` (default `warn`).

use std::time::Duration;

use clap::Parser;
use document_indexing::{Claimed, Indexed, Indexer};
use sqlx::postgres::PgPoolOptions;
use taskfence::{PgStore, TaskId};
use tracing_subscriber::EnvFilter;

const LEASE: Duration = Duration::from_secs(30);

/// Every option is a flag and an environment variable.
#[derive(Debug, clap::Parser)]
#[command(
    name = "story",
    about = "The document-indexing story: versions indexed once, never rolled back."
)]
struct Args {
    /// PostgreSQL URL. TLS: add `?sslmode=verify-full&sslrootcert=/path/ca.pem`
    /// (as RDS needs) or `?sslmode=require`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,

    /// Prefix of the two schemas the story creates (and drops at the end).
    #[arg(long, env = "DOCIDX_SCHEMA_PREFIX", default_value = "docidx_demo")]
    schema_prefix: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        // stdout is the story; logs must not interleave with it.
        .with_writer(std::io::stderr)
        .init();
    // It reads no `TASKFENCE_*` variable: one set is a mistake, reported.
    if let Some(unknown) = taskfence::config::unknown_env(&[]) {
        tracing::warn!("{unknown}");
    }
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .connect(&args.database_url)
        .await?;
    let run = format!("{}_{}", args.schema_prefix, std::process::id());
    tracing::info!(schema = %run, "connected");
    let store = PgStore::builder(pool.clone())
        .schema(format!("{run}_tasks"))
        .build()?;
    store.migrate().await?;
    let indexer = Indexer::new(store.clone(), &run)?;
    indexer.migrate().await?;

    let story = tell(&indexer).await;
    for schema in [format!("{run}_tasks"), run] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .execute(&pool)
        .await?;
    }
    story
}

async fn tell(indexer: &Indexer) -> Result<(), Box<dyn std::error::Error>> {
    let v1 = "Decision: ship in March.\n\nOwner: Ana.";
    let v2 = "Decision: ship in April.\n\nOwner: Ben.\n\nRisk: supplier delay.";

    println!("1. The browser uploads version 1 of \"plan\" three times (timeouts, retries).");
    let mut v1_task = None;
    for _ in 0..3 {
        let up = indexer.upload("plan", 1, v1).await?;
        println!("   task {} (created: {})", up.task.id, up.created);
        v1_task = Some(up.task.id);
    }
    let v1_task: TaskId = v1_task.expect("uploaded");

    println!("2. The dispatcher publishes the handoff; the queue delivers it twice.");
    let mut deliveries = Vec::new();
    indexer
        .store()
        .dispatch(10, |stamp| {
            deliveries.extend([stamp.task_id, stamp.task_id]);
            async { Ok::<(), std::convert::Infallible>(()) }
        })
        .await?;
    for (n, id) in deliveries.into_iter().enumerate() {
        let outcome = indexer.index_once(&format!("worker-{n}"), id, LEASE).await?;
        println!("   delivery {n}: {}", describe(&outcome));
    }

    println!("3. A re-upload of version 1 with other bytes is refused:");
    match indexer.upload("plan", 1, "Rewritten.").await {
        Err(err) => println!("   {err}"),
        Ok(_) => return Err("a conflicting version was accepted".into()),
    }

    println!("4. Versions 2 and 3 are uploaded; the worker for v2 pauses after claiming");
    println!("   while v3 is indexed, then finishes with its lease still valid.");
    let v2_task = indexer.upload("plan", 2, v2).await?.task.id;
    let v3_task = indexer
        .upload("plan", 3, &format!("{v2}\n\nStatus: approved."))
        .await?
        .task
        .id;
    let Claimed::Job(slow) = indexer.claim(v2_task, "worker-slow", LEASE).await? else {
        return Err("v2 should be claimable".into());
    };
    let outcome = indexer.index_once("worker-fast", v3_task, LEASE).await?;
    println!("   v3: {}", describe(&outcome));
    let mut conn = indexer.store().pool().acquire().await?;
    let outcome = indexer.commit(&mut conn, slow).await?;
    println!("   the slow v2 worker finishes: {}", describe(&outcome));

    let current = indexer.current_version("plan").await?;
    let visible = indexer.visible_entries("plan").await?;
    println!(
        "5. Readers see version {}: {} entries",
        current.unwrap_or(0),
        visible.len()
    );
    for entry in &visible {
        println!("   v{} #{}: {}", entry.version, entry.chunk, entry.body);
    }
    if current != Some(3) || visible.iter().any(|e| e.version != 3) {
        return Err("an older version became visible".into());
    }
    let done = indexer.index_once("worker-late", v1_task, LEASE).await?;
    println!("   a very late v1 delivery: {}", describe(&done));
    println!("story complete: version 3 is current");
    Ok(())
}

fn describe(outcome: &Indexed) -> String {
    match outcome {
        Indexed::Done {
            entries_written,
            became_current,
            ..
        } => format!("indexed, {entries_written} entries written, became current: {became_current}"),
        Indexed::AlreadyDone(_) => "already done, nothing written".into(),
        Indexed::Rejected(why) => format!("rejected ({why}), nothing written"),
        Indexed::NotClaimed(claim) => format!("not claimed now: {claim:?}"),
    }
}
