//! The table [`DynamoStore`](super::DynamoStore) works on: key schema, the
//! indexes (`due`, `purge`, and for inspection `status` and `unclaimed`) and
//! the TTL attribute, and [`create_table`], which makes one
//! (tests, local development; production tables usually come from
//! infrastructure code with the same definition, see `docs/DYNAMODB.md`).

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TimeToLiveSpecification,
};

use crate::error::Error;
use crate::error::Result;

/// Partition key of every item (`S`): `T#<task id>` for a task and its
/// attempts, `K#…` for a dedup record.
///
/// ```
/// assert_eq!(taskfence::dynamodb::PARTITION_KEY, "pk");
/// ```
pub const PARTITION_KEY: &str = "pk";
/// Sort key of every item (`S`): `T` (task), `A#<10-digit attempt number>`
/// (attempt), `R#…` (reopening), `H#…` (handoff), `E#<effect name>`
/// (effect), `K` (dedup record).
///
/// ```
/// assert_eq!(taskfence::dynamodb::SORT_KEY, "sk");
/// ```
pub const SORT_KEY: &str = "sk";
/// The sparse index `due` reads: only tasks with a running lease or a
/// scheduled backoff carry its key attributes.
///
/// ```
/// assert_eq!(taskfence::dynamodb::DUE_INDEX, "due");
/// ```
pub const DUE_INDEX: &str = "due";
/// The sparse index `purge_expired` reads: only terminal tasks carry its key
/// attributes.
///
/// ```
/// assert_eq!(taskfence::dynamodb::PURGE_INDEX, "purge");
/// ```
pub const PURGE_INDEX: &str = "purge";
/// Partition key of [`DUE_INDEX`] (`S`, one value: `due`).
///
/// ```
/// assert_eq!(taskfence::dynamodb::DUE_SHARD, "due_shard");
/// ```
pub const DUE_SHARD: &str = "due_shard";
/// Sort key of [`DUE_INDEX`] (`N`, Unix nanoseconds): the lease expiry or the
/// end of the backoff.
///
/// ```
/// assert_eq!(taskfence::dynamodb::DUE_AT, "due_at");
/// ```
pub const DUE_AT: &str = "due_at";
/// Partition key of [`PURGE_INDEX`] (`S`, one value: `purge`).
///
/// ```
/// assert_eq!(taskfence::dynamodb::PURGE_SHARD, "purge_shard");
/// ```
pub const PURGE_SHARD: &str = "purge_shard";
/// Sort key of [`PURGE_INDEX`] (`N`, Unix nanoseconds): the end of the
/// retention window.
///
/// ```
/// assert_eq!(taskfence::dynamodb::PURGE_AT, "purge_at");
/// ```
pub const PURGE_AT: &str = "purge_at";
/// The index [`Inspect::list`](crate::inspect::Inspect::list) and
/// [`Inspect::counts`](crate::inspect::Inspect::counts) read: task items by
/// `status` (partition key), then `task_id` (sort key, UUID v7 text: the
/// submission order), carrying `scope`, `operation` and `created_at` for
/// filters. Only task items have a `status`, so nothing else is in it.
///
/// ```
/// assert_eq!(taskfence::dynamodb::STATUS_INDEX, "status");
/// ```
pub const STATUS_INDEX: &str = "status";
/// The sparse index [`Inspect::stranded`](crate::inspect::Inspect::stranded)
/// reads: only never-claimed pending tasks carry its key attributes.
///
/// ```
/// assert_eq!(taskfence::dynamodb::UNCLAIMED_INDEX, "unclaimed");
/// ```
pub const UNCLAIMED_INDEX: &str = "unclaimed";
/// Partition key of [`UNCLAIMED_INDEX`] (`S`, one value: `unclaimed`).
///
/// ```
/// assert_eq!(taskfence::dynamodb::UNCLAIMED_SHARD, "unclaimed_shard");
/// ```
pub const UNCLAIMED_SHARD: &str = "unclaimed_shard";
/// Sort key of [`UNCLAIMED_INDEX`] (`S`): the submission instant in Unix
/// nanoseconds, zero-padded to 21 digits, `#`, the task id — oldest first,
/// ties by id.
///
/// ```
/// assert_eq!(taskfence::dynamodb::UNCLAIMED_AT, "unclaimed_at");
/// ```
pub const UNCLAIMED_AT: &str = "unclaimed_at";
/// The TTL attribute (`N`, Unix seconds), set on a dedup record once its task
/// is terminal: DynamoDB's own expiry, a backstop behind `purge_expired`.
///
/// ```
/// assert_eq!(taskfence::dynamodb::TTL, "ttl");
/// ```
pub const TTL: &str = "ttl";

/// Creates a table with the definition [`DynamoStore`](super::DynamoStore)
/// needs (on-demand capacity), waits until it is active, and turns TTL on.
/// The same definition as a CLI command is in `docs/DYNAMODB.md`.
///
/// ```no_run
/// # async fn f(client: aws_sdk_dynamodb::Client) -> taskfence::Result<()> {
/// taskfence::dynamodb::create_table(&client, "taskfence").await?;
/// # Ok(()) }
/// ```
pub async fn create_table(client: &Client, table: &str) -> Result<()> {
    let attr = |name: &str, ty: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ty)
            .build()
            .expect("name and type are set")
    };
    let key = |name: &str, ty: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(ty)
            .build()
            .expect("name and type are set")
    };
    let due = GlobalSecondaryIndex::builder()
        .index_name(DUE_INDEX)
        .key_schema(key(DUE_SHARD, KeyType::Hash))
        .key_schema(key(DUE_AT, KeyType::Range))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::KeysOnly)
                .build(),
        )
        .build()
        .expect("index fields are set");
    // The purge reads the request key from the index to delete the dedup
    // record without reading the task first.
    let purge = GlobalSecondaryIndex::builder()
        .index_name(PURGE_INDEX)
        .key_schema(key(PURGE_SHARD, KeyType::Hash))
        .key_schema(key(PURGE_AT, KeyType::Range))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::Include)
                .non_key_attributes("scope")
                .non_key_attributes("operation")
                .non_key_attributes("rkey")
                .build(),
        )
        .build()
        .expect("index fields are set");
    // Inspection: the page's ids and the filters' attributes; the tasks
    // themselves are read from the table (consistent), so a task's every
    // other change never writes this index.
    let status = GlobalSecondaryIndex::builder()
        .index_name(STATUS_INDEX)
        .key_schema(key("status", KeyType::Hash))
        .key_schema(key("task_id", KeyType::Range))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::Include)
                .non_key_attributes("scope")
                .non_key_attributes("operation")
                .non_key_attributes("created_at")
                .build(),
        )
        .build()
        .expect("index fields are set");
    let unclaimed = GlobalSecondaryIndex::builder()
        .index_name(UNCLAIMED_INDEX)
        .key_schema(key(UNCLAIMED_SHARD, KeyType::Hash))
        .key_schema(key(UNCLAIMED_AT, KeyType::Range))
        .projection(
            Projection::builder()
                .projection_type(ProjectionType::KeysOnly)
                .build(),
        )
        .build()
        .expect("index fields are set");
    client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(PARTITION_KEY, ScalarAttributeType::S))
        .attribute_definitions(attr(SORT_KEY, ScalarAttributeType::S))
        .attribute_definitions(attr(DUE_SHARD, ScalarAttributeType::S))
        .attribute_definitions(attr(DUE_AT, ScalarAttributeType::N))
        .attribute_definitions(attr(PURGE_SHARD, ScalarAttributeType::S))
        .attribute_definitions(attr(PURGE_AT, ScalarAttributeType::N))
        .attribute_definitions(attr("status", ScalarAttributeType::S))
        .attribute_definitions(attr("task_id", ScalarAttributeType::S))
        .attribute_definitions(attr(UNCLAIMED_SHARD, ScalarAttributeType::S))
        .attribute_definitions(attr(UNCLAIMED_AT, ScalarAttributeType::S))
        .key_schema(key(PARTITION_KEY, KeyType::Hash))
        .key_schema(key(SORT_KEY, KeyType::Range))
        .global_secondary_indexes(due)
        .global_secondary_indexes(purge)
        .global_secondary_indexes(status)
        .global_secondary_indexes(unclaimed)
        .send()
        .await
        .map_err(Error::storage)?;
    wait_until_active(client, table).await?;
    client
        .update_time_to_live()
        .table_name(table)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(TTL)
                .build()
                .expect("enabled and name are set"),
        )
        .send()
        .await
        .map_err(Error::storage)?;
    Ok(())
}

/// Polls `DescribeTable` until the table (and its indexes) are `ACTIVE`.
async fn wait_until_active(client: &Client, table: &str) -> Result<()> {
    use aws_sdk_dynamodb::types::{IndexStatus, TableStatus};
    for _ in 0..600 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(Error::storage)?;
        let Some(t) = described.table() else { continue };
        let indexes_active = t
            .global_secondary_indexes()
            .iter()
            .all(|i| i.index_status().is_none_or(|s| *s == IndexStatus::Active));
        if t.table_status() == Some(&TableStatus::Active) && indexes_active {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(Error::storage(NotActive(table.to_owned())))
}

/// The table did not become active within a minute.
#[derive(Debug, thiserror::Error)]
#[error("table {0} did not become ACTIVE within 60 s")]
struct NotActive(String);
