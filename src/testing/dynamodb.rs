//! [`DynamoFixture`]: the conformance [`Fixture`] for [`DynamoStore`] on a
//! real DynamoDB API (DynamoDB Local, moto, or an AWS account), one fresh
//! table per fixture so tests run in parallel. Re-exported from
//! [`crate::testing`] (features `dynamodb` and `testing`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, Put, Select, TransactWriteItem};

use crate::clock::ManualClock;
use crate::dynamodb::{DynamoStore, create_table};
use crate::inspect::Inspect;
use crate::store::{Fenced, Lease, TaskStore};
use crate::testing::{FencedWritesFixture, Fixture, InspectFixture, OutboxFixture};

/// Partition key of the application's rows of [`FencedWritesFixture`], in
/// the fixture's own table (no index key, so the store never sees them).
const APP_ROWS_PK: &str = "app#rows";

/// Tables created by fixtures start with this.
const PREFIX: &str = "taskfence_test_";
/// Fixture tables older than this (left behind by a killed run) are deleted
/// when a new fixture is made.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// A [`DynamoStore`] on a fresh table of its own (deleted when the fixture
/// is dropped) and a [`ManualClock`] the suite moves.
///
/// ```no_run
/// # async fn f(client: aws_sdk_dynamodb::Client) {
/// use taskfence::testing::{DynamoFixture, Fixture};
/// let fixture = DynamoFixture::new(client).await;
/// assert_eq!(fixture.record_count().await, 0);
/// fixture.advance(std::time::Duration::from_secs(31)).await; // leases granted before now expired
/// # }
/// ```
#[derive(Debug)]
pub struct DynamoFixture {
    store: DynamoStore,
    clock: ManualClock,
    client: Client,
}

impl DynamoFixture {
    /// Creates a table with a unique name through `client` and a store on it
    /// with a manual clock standing at the current time.
    ///
    /// # Panics
    ///
    /// When the table cannot be created: a test that needs DynamoDB must not
    /// silently pass without it.
    ///
    /// ```no_run
    /// # async fn f(client: aws_sdk_dynamodb::Client) {
    /// let fixture = taskfence::testing::DynamoFixture::new(client).await;
    /// assert!(fixture.table().starts_with("taskfence_test_"));
    /// # }
    /// ```
    pub async fn new(client: Client) -> Self {
        delete_stale_tables(&client).await;
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let table = format!("{PREFIX}{}_{}", unix_secs(), &unique[unique.len() - 12..]);
        create_table(&client, &table)
            .await
            .unwrap_or_else(|e| panic!("cannot create DynamoDB table {table}: {e:?}"));
        let clock = ManualClock::default();
        let store = DynamoStore::builder(client.clone(), table)
            .clock(clock.clone())
            .build()
            .expect("generated table names are valid");
        Self { store, clock, client }
    }

    /// The concrete store (for `with(items)`, the client).
    ///
    /// ```no_run
    /// # fn f(fixture: taskfence::testing::DynamoFixture) {
    /// let store: &taskfence::DynamoStore = fixture.dynamo_store();
    /// # }
    /// ```
    pub fn dynamo_store(&self) -> &DynamoStore {
        &self.store
    }

    /// The clock the store runs on.
    ///
    /// ```no_run
    /// # fn f(fixture: taskfence::testing::DynamoFixture) {
    /// fixture.clock().advance(std::time::Duration::from_secs(5));
    /// # }
    /// ```
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The fixture's table.
    ///
    /// ```no_run
    /// # fn f(fixture: taskfence::testing::DynamoFixture) {
    /// println!("{}", fixture.table());
    /// # }
    /// ```
    pub fn table(&self) -> &str {
        self.store.table()
    }

    /// Deletes the dedup record of `key`, as DynamoDB's TTL does once the
    /// record's `ttl` has passed (the local API never expires items): what a
    /// test of life after a record's expiry needs.
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::DynamoFixture, key: taskfence::RequestKey) {
    /// fixture.expire_dedup_record(&key).await;
    /// # }
    /// ```
    pub async fn expire_dedup_record(&self, key: &crate::RequestKey) {
        self.client
            .delete_item()
            .table_name(self.table())
            .set_key(Some(crate::dynamodb::item::key_of(
                crate::dynamodb::item::key_pk(key),
                crate::dynamodb::item::KEY_SK,
            )))
            .send()
            .await
            .expect("delete the dedup record");
    }

    /// Items in the table whose sort key starts with `prefix`: `T` tasks,
    /// `A#` attempts, `R#` reopenings, `H#` handoffs, `E#` effects, `K`
    /// dedup records (a consistent scan: a test helper,
    /// never the store's path).
    ///
    /// ```no_run
    /// # async fn f(fixture: taskfence::testing::DynamoFixture) {
    /// let attempts = fixture.count("A#").await;
    /// # }
    /// ```
    pub async fn count(&self, prefix: &str) -> u64 {
        self.scan_count(Some(prefix)).await
    }

    async fn scan_count(&self, prefix: Option<&str>) -> u64 {
        let mut total = 0u64;
        let mut start = None;
        loop {
            let mut scan = self
                .client
                .scan()
                .table_name(self.table())
                .select(Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start);
            if let Some(prefix) = prefix {
                scan = scan
                    .filter_expression("begins_with(#sk, :prefix)")
                    .expression_attribute_names("#sk", crate::dynamodb::SORT_KEY)
                    .expression_attribute_values(":prefix", AttributeValue::S(prefix.to_owned()));
            }
            let page = scan.send().await.expect("count items");
            total += u64::try_from(page.count()).unwrap_or(0);
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return total;
            }
        }
    }
}

#[async_trait]
impl Fixture for DynamoFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// Every item of the table: tasks, attempts, reopenings, handoffs,
    /// effects, dedup records (and [`FencedWritesFixture`]'s rows).
    async fn record_count(&self) -> u64 {
        self.scan_count(None).await
    }
}

/// The application's rows are items of the fixture's table
/// (`pk = app#rows`, `sk = <row>`), written with
/// [`with(items).write(&lease)`](crate::dynamodb::WithItems::write): one
/// transaction, the lease's fence check and the row's put.
#[async_trait]
impl FencedWritesFixture for DynamoFixture {
    async fn write_fenced(&self, lease: &Lease, row: &str) -> crate::Result<Fenced<()>> {
        let put = Put::builder()
            .table_name(self.table())
            .item(
                crate::dynamodb::PARTITION_KEY,
                AttributeValue::S(APP_ROWS_PK.to_owned()),
            )
            .item(crate::dynamodb::SORT_KEY, AttributeValue::S(row.to_owned()))
            .build()
            .expect("table and item are set");
        let items = vec![TransactWriteItem::builder().put(put).build()];
        self.store.with(items).write(lease).await
    }

    async fn rows(&self) -> Vec<String> {
        let page = self
            .client
            .query()
            .table_name(self.table())
            .key_condition_expression("#pk = :pk")
            .expression_attribute_names("#pk", crate::dynamodb::PARTITION_KEY)
            .expression_attribute_values(":pk", AttributeValue::S(APP_ROWS_PK.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("read the application's rows");
        page.items()
            .iter()
            .filter_map(|row| row.get(crate::dynamodb::SORT_KEY)?.as_s().ok().cloned())
            .collect()
    }
}

impl InspectFixture for DynamoFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        Arc::new(self.store.clone())
    }
}

/// The outbox is the handoff items (`H#…`) of the table.
#[async_trait]
impl OutboxFixture for DynamoFixture {
    type Store = DynamoStore;

    fn outbox(&self) -> DynamoStore {
        self.store.clone()
    }

    async fn handoff_count(&self) -> u64 {
        self.count(crate::dynamodb::item::HANDOFF_PREFIX).await
    }
}

impl Drop for DynamoFixture {
    /// Deletes the table on a short-lived thread with its own runtime (Drop
    /// cannot await), within ten seconds; a failure leaves it for the
    /// stale-table cleanup of a later fixture.
    fn drop(&mut self) {
        let (client, table) = (self.client.clone(), self.table().to_owned());
        let deleter = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let delete = client.delete_table().table_name(table).send();
                tokio::time::timeout(Duration::from_secs(10), delete)
                    .await
                    .ok()?
                    .ok()
            })
        });
        let _ = deleter.join();
    }
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Deletes fixture tables left behind by killed runs (older than [`STALE_AFTER`]).
async fn delete_stale_tables(client: &Client) {
    let cutoff = unix_secs().saturating_sub(STALE_AFTER.as_secs());
    let mut start: Option<String> = None;
    loop {
        let Ok(page) = client
            .list_tables()
            .set_exclusive_start_table_name(start)
            .send()
            .await
        else {
            return;
        };
        for name in page.table_names() {
            let created = name
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split('_').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            if created.is_some_and(|secs| secs < cutoff) {
                let _ = client.delete_table().table_name(name).send().await;
            }
        }
        start = page.last_evaluated_table_name().map(str::to_owned);
        if start.is_none() {
            return;
        }
    }
}
