//! Fills a PostgreSQL schema with a few tasks in every state, to try the
//! `taskfence` tool on (the README's output comes from it):
//!
//! ```sh
//! cargo run -p taskfence-cli --example demo_data -- postgres://postgres@127.0.0.1:5432/test taskfence_demo
//! taskfence --database-url postgres://postgres@127.0.0.1:5432/test --schema taskfence_demo stats
//! ```

use std::time::Duration;

use taskfence::{
    Claim, ClaimRequest, Failure, InputHash, NewTask, PgStore, RequestKey, Response, RetryPolicy, TaskStore,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema)) = (args.next(), args.next()) else {
        return Err("usage: demo_data <postgres-url> <schema>".into());
    };
    let pool = sqlx::PgPool::connect(&url).await?;
    let store = PgStore::builder(pool).schema(schema).build()?;
    store.migrate().await?;
    let lease = Duration::from_secs(60);
    let submit = |scope: &str, op: &str, key: &str, policy: RetryPolicy| {
        NewTask::new(RequestKey::new(scope, op, key), InputHash::of([key]))
            .payload(format!("{{\"request\":\"{key}\"}}").into_bytes())
            .policy(policy)
    };

    // Completed replies.
    for i in 1..=3 {
        let task = store
            .submit(submit(
                "tenant-7",
                "chat.reply",
                &format!("req-{i}"),
                RetryPolicy::default(),
            ))
            .await?
            .into_task();
        if let Claim::Acquired(l) = store.claim(task.id, ClaimRequest::new("worker-a", lease)).await? {
            let _ = store.complete(l, Response::from("Here is the summary…")).await?;
        }
    }
    // Two that ran out of attempts against a provider quota.
    for key in ["req-4", "req-5"] {
        let task = store
            .submit(submit(
                "tenant-7",
                "chat.reply",
                key,
                RetryPolicy::default().max_attempts(2),
            ))
            .await?
            .into_task();
        for worker in ["worker-a", "worker-b"] {
            tokio::time::sleep(Duration::from_millis(1100)).await; // the backoff
            if let Claim::Acquired(l) = store.claim(task.id, ClaimRequest::new(worker, lease)).await? {
                let _ = store
                    .fail(
                        l,
                        Failure::retryable("provider: 429 quota exceeded for model gpt-x"),
                    )
                    .await?;
            }
        }
    }
    // One running, one waiting, one cancelled, in another scope.
    let running = store
        .submit(submit("tenant-9", "doc.index", "doc-88", RetryPolicy::default()))
        .await?
        .into_task();
    let _ = store
        .claim(running.id, ClaimRequest::new("worker-c", lease))
        .await?;
    store
        .submit(submit("tenant-9", "doc.index", "doc-89", RetryPolicy::default()))
        .await?;
    let cancelled = store
        .submit(submit("tenant-9", "doc.index", "doc-90", RetryPolicy::default()))
        .await?
        .into_task();
    let _ = store
        .cancel(cancelled.id, "document deleted by its owner")
        .await?;
    println!("demo data in schema {}", store.schema());
    Ok(())
}
