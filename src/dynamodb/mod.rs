//! [`DynamoStore`]: the DynamoDB backend (feature `dynamodb`), on
//! `aws-sdk-dynamodb`, with the same contract and typed outcomes as every
//! other backend.
//!
//! The application builds the `aws_sdk_dynamodb::Client` (credentials,
//! region, endpoint, HTTP client) and names the table; the library reads no
//! configuration of its own. Create the table with [`create_table`] or the
//! definition in `docs/DYNAMODB.md`.
//!
//! - **One table, nine kinds of item.** A task (`pk = T#<id>`, `sk = T`),
//!   its attempts (`pk = T#<id>`, `sk = A#<number>`, one item each, so a task
//!   with many attempts never nears the 400 KB item limit), its reopenings
//!   by [`reopen`](crate::TaskStore::reopen) (`sk = R#<number>`), its
//!   handoffs (`sk = H#<instant>#<uuid>`, the outbox), its
//!   [effect journal](crate::effect) (`sk = E#<effect name>`, one item per
//!   effect), and its dedup record (`pk = K#<scope, operation, key>`, `sk = K`).
//!   Limits add three more (`docs/LIMITS.md`, "On DynamoDB"): a concurrency
//!   key's item (`pk = C#<key>`, `sk = C`: its claims' `version`, its slots'
//!   holders, its submission order), a member item per task of a key
//!   (`sk = O#<order>`), and a rate bucket's item (`pk = B`, `sk = <name>`).
//! - **Limits in the claim's transaction.** A claim of a task naming a
//!   concurrency key or a rate bucket reads their items, decides with
//!   [`rules::within_limits`](crate::backend::rules::within_limits), and
//!   writes them back with the claim on the condition that they are as
//!   read: two racing claims of one key cannot both pass on one count.
//! - **Every decision one conditional request.** A fenced write is one
//!   `UpdateItem` or `TransactWriteItems` whose `ConditionExpression` is the
//!   guard: version, status, the lease against the writer's clock (a running
//!   task has no response). The attempt item changes in the same
//!   transaction. A refused write asks for `ALL_OLD` and is classified from
//!   that image by the same [`rules`](crate::backend::rules) functions every backend
//!   uses: no extra read.
//! - **Submission is atomic**: the dedup record, the task and its handoff
//!   are put in one transaction, record and task on `attribute_not_exists`.
//!   The same key with other inputs is [`Error::KeyConflict`](crate::Error::KeyConflict)
//!   read from the refused record's image; nothing is written.
//! - **The transactional outbox**, as on PostgreSQL: submit (unless
//!   [`without_handoff`](crate::NewTask::without_handoff)), reopen and
//!   [`redispatch`](crate::dispatch::Outbox::redispatch) write a handoff
//!   item in the task's partition, in the `due` index under the key value
//!   `handoff` while unpublished; the dispatcher
//!   ([`Outbox::dispatch`](crate::dispatch::Outbox::dispatch), the one loop
//!   on this backend's [`OutboxBackend`](crate::backend::OutboxBackend)
//!   steps) publishes them through the caller's closure, at least once, and
//!   marks each batch published as soon as its publish succeeded. [`Inspect::story`](crate::inspect::Inspect::story)
//!   lists them; `purge_expired` deletes them with their task.
//! - **Requests per operation** (as `tests/dynamodb/requests.rs` counts them):
//!   submit 1 (a repeat 2: the refused transaction, then the task),
//!   claim 2 (a read, then the transaction: the new attempt's item is keyed
//!   by the new version, which only a read tells), renew 1, complete 1,
//!   fail 1, release 1, record_operation 1, cancel 2, reopen 2, get 1, find 2,
//!   begin_effect and finish_effect 2 (a `TransactGetItems` of the task and
//!   the effect item, then the fence check and the effect's put in one
//!   transaction; an answer that writes nothing, or a rejection, is the read
//!   only), effects 1 (per 1 MB page),
//!   attempts 1 (per 1 MB page), due 1 (per page of the index),
//!   dispatch 1 + 1 + one per published handoff (the index, a consistent
//!   `BatchGetItem` per 100, one `UpdateItem` mark each), redispatch one
//!   transaction per task, purge_expired 1 + 5 per purged task; `claim_many` of *n* one
//!   `BatchGetItem` per 100 plus one transaction per task (concurrent),
//!   `complete_many` one transaction per task (concurrent), `renew_many` one
//!   `UpdateItem` per lease (concurrent).
//! - **Inspection from indexes**: [`Inspect`](crate::inspect::Inspect)
//!   lists and counts from [`STATUS_INDEX`], finds stranded tasks in the
//!   sparse [`UNCLAIMED_INDEX`], tells a story from the task's partition;
//!   what each reads is in `docs/DYNAMODB.md`.
//! - **Time is the writer's clock.** DynamoDB has no clock to compare with
//!   in a condition: each store compares leases with its own
//!   [`Clock`](crate::clock::Clock) (injectable, [`DynamoStoreBuilder::clock`]).
//!   Under *any* skew, at most one response is saved and a superseded
//!   assignment never saves under `CurrentAssignment` (under
//!   `FirstValidAnswer` an earlier attempt's answer wins, by design):
//!   versions, not clocks, decide those. *When* a
//!   lease counts as expired depends on bounded skew: a fast clock may take
//!   a task over early (wasted work, never a second saved response), a slow
//!   one may let a late worker save while no one has taken over.
//! - **Indexes, no scans.** `due` reads the sparse index [`DUE_INDEX`],
//!   `purge_expired` the sparse index [`PURGE_INDEX`]; both are eventually
//!   consistent, so an entry may show up a moment late (publishing twice is
//!   harmless, and the purge's own deletes re-check their conditions). A
//!   dedup record gets a TTL ([`TTL`]) when its task turns terminal, as a
//!   backstop; `purge_expired` still removes expired records itself.
//! - **The application's writes in the same transaction**:
//!   [`DynamoStore::with`] takes the application's `TransactWriteItem`s,
//!   which commit with the handle's next write (a submission, a completion,
//!   a failure, a release, a recorded operation) or not at all: a
//!   [`WithItems`] is a [`TaskStore`](crate::TaskStore) as far as one
//!   `TransactWriteItems` allows, and says which operations it refuses.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `store` | [`DynamoStore`], [`DynamoStoreBuilder`], the task operations: each decision and its transaction |
//! | `expr` | update and condition expressions; the guards every write carries |
//! | `tx` | sending a transaction, reading its cancellation, retrying conflicts and throttling; errors |
//! | `read` | consistent gets, batch gets, transactional gets, queries of a partition and of the queue indexes |
//! | `reopen` | an operator's reopening: the task, its dedup record and the reopening item in one transaction |
//! | `purge` | retention: `purge_expired`, each task claimed before it is deleted |
//! | `dispatch` | the outbox: the [`OutboxBackend`](crate::backend::OutboxBackend) steps under [`Outbox`](crate::dispatch::Outbox) (`dispatch`, `dispatch_batches`, `redispatch`) |
//! | `limits` | concurrency keys and rate buckets: what a claim reads, the key and bucket items it writes, submission order, `define_bucket`, `drain_bucket`, `buckets`, `concurrency` |
//! | `effect` | the effect journal: `begin_effect`, `finish_effect`, `effects`, each a snapshot read and one conditional transaction |
//! | `inspect` | [`Inspect`](crate::inspect::Inspect): listings, counts, stories, stranded tasks |
//! | `with` | [`WithItems`] (a `TaskStore` whose next write carries the application's items), [`ExtraRefused`] |
//! | `item` | items to domain values and back: the only place that knows attribute names |
//! | `table` | the table definition, [`create_table`] |

mod bounded;
mod dispatch;
mod effect;
mod expr;
mod inspect;
pub(crate) mod item;
mod limits;
mod purge;
mod read;
mod reopen;
mod store;
mod table;
mod tx;
mod with;

pub use limits::MAX_CONCURRENCY;
pub use store::{DynamoStore, DynamoStoreBuilder};
pub use table::{
    DUE_AT, DUE_INDEX, DUE_SHARD, PARTITION_KEY, PURGE_AT, PURGE_INDEX, PURGE_SHARD, SORT_KEY, STATUS_INDEX,
    TTL, UNCLAIMED_AT, UNCLAIMED_INDEX, UNCLAIMED_SHARD, create_table,
};
pub use with::{ExtraRefused, WithItems};

/// Largest payload this backend stores, in bytes: the task item holds the
/// payload, the response ([`MAX_RESPONSE_LEN`]) and up to 8 KiB of error
/// text, and must stay under DynamoDB's 400 KB item limit. Larger payloads
/// are [`InvalidInput`](crate::error::InvalidInput), nothing written.
///
/// ```
/// assert!(taskfence::dynamodb::MAX_PAYLOAD_LEN < taskfence::limits::MAX_PAYLOAD_LEN);
/// ```
pub const MAX_PAYLOAD_LEN: usize = 160 * 1024;

/// Largest response this backend saves, in bytes (see [`MAX_PAYLOAD_LEN`]).
///
/// ```
/// assert_eq!(taskfence::dynamodb::MAX_RESPONSE_LEN, 200 * 1024);
/// ```
pub const MAX_RESPONSE_LEN: usize = 200 * 1024;

/// Most items the application may give [`DynamoStore::with`]: DynamoDB's 100 items per transaction,
/// less the store's own (at most four).
///
/// ```
/// assert_eq!(taskfence::dynamodb::MAX_EXTRA_ITEMS, 96);
/// ```
pub const MAX_EXTRA_ITEMS: usize = 96;
