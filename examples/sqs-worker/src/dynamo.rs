//! The all-AWS store (`--store dynamodb`): taskfence's `DynamoStore` on one
//! table, with its transactional outbox in the same table.

use crate::BoxError;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;

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
