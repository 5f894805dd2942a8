//! The all-AWS store: taskfence's [`DynamoStore`] on one DynamoDB table,
//! with the library's transactional outbox on DynamoDB.
//!
//! `submit` writes the task, its dedup record and its handoff item in one
//! `TransactWriteItems` (a repeated submission writes none of them), and
//! [`DynamoStore::dispatch_batches`] publishes the handoffs: the same shape
//! as PostgreSQL's outbox (see [`Dispatcher`](crate::Dispatcher)). A
//! published handoff stays in the task's partition with its `published_at`
//! (the task's `story` shows it) until `purge_expired` removes the task.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use taskfence::inspect::Inspect;
use taskfence::{DynamoStore, TaskId};

use crate::queue::BoxError;

/// Fails unless `table` exists and the credentials may describe it: at
/// start-up, so a wrong name, region or role stops the service at once.
pub async fn check_table(client: &Client, table: &str) -> Result<(), BoxError> {
    client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| format!("DynamoDB table {table}: {}", DisplayErrorContext(e)))?;
    Ok(())
}

/// How many handoffs of `tasks` are not published yet (one consistent
/// `Query` of each task's partition): what a test or an operator checks to
/// see the outbox drained.
pub async fn unpublished(store: &DynamoStore, tasks: &[TaskId]) -> Result<usize, BoxError> {
    let mut pending = 0;
    for &id in tasks {
        if let Some(story) = store.story(id).await? {
            pending += story.handoffs.iter().filter(|h| h.published_at.is_none()).count();
        }
    }
    Ok(pending)
}
