//! Items to domain values and back: the only place that knows attribute names
//! and types. Instants are Unix nanoseconds (`N`), durations nanoseconds,
//! bytes `B`; `f64` policy fields are their shortest round-trip text (`S`), so
//! a policy reads back bit for bit.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use time::OffsetDateTime;

use crate::effect::{Effect, EffectKey, EffectState};
use crate::inspect::Handoff;
use crate::policy::{AcceptanceRule, OnAmbiguous, RetryPolicy};
use crate::store::{Attempt, AttemptOutcome, Reopening};
use crate::task::{AttemptId, InputHash, RequestKey, Response, Status, Task, TaskId};
use crate::throttle::{BucketState, ConcurrencyKey, RateBucket, TaskLimits};

use super::table::{
    DUE_AT, DUE_SHARD, PARTITION_KEY, SORT_KEY, UNCLAIMED_AT, UNCLAIMED_INDEX, UNCLAIMED_SHARD,
};

/// An item as the SDK gives it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Sort key of a task item.
pub(crate) const TASK_SK: &str = "T";
/// Sort key of a dedup record.
pub(crate) const KEY_SK: &str = "K";
/// Sort key prefix of attempt items.
pub(crate) const ATTEMPT_PREFIX: &str = "A#";
/// Sort key prefix of reopening items (one per [`reopen`](crate::TaskStore::reopen)).
pub(crate) const REOPENING_PREFIX: &str = "R#";
/// Sort key prefix of handoff items (the outbox: one per submission,
/// reopening and redispatch of a task with a handoff). `H#` sorts before
/// `T`, so a purge's `sk < T` query of the partition takes them too.
pub(crate) const HANDOFF_PREFIX: &str = "H#";
/// The `due` index's partition-key value of an unpublished handoff: the
/// outbox shares that index with the due tasks (shard `due`), under its own
/// key value, so `due` never sees a handoff and the table needs no new index.
pub(crate) const HANDOFF_SHARD: &str = "handoff";
/// Sort key prefix of effect items (the journal: one per effect name of
/// the task). `E#` sorts before `T`, so a purge's `sk < T` query of the
/// partition takes them too.
pub(crate) const EFFECT_PREFIX: &str = "E#";

// Attribute names, once.
pub(crate) const TASK_ID: &str = "task_id";
pub(crate) const SCOPE: &str = "scope";
pub(crate) const OPERATION: &str = "operation";
pub(crate) const RKEY: &str = "rkey";
pub(crate) const INPUT_HASH: &str = "input_hash";
pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const STATUS: &str = "status";
pub(crate) const VERSION: &str = "version";
pub(crate) const MAX_ATTEMPTS: &str = "max_attempts";
pub(crate) const INITIAL_BACKOFF: &str = "initial_backoff_ns";
pub(crate) const MAX_BACKOFF: &str = "max_backoff_ns";
pub(crate) const MULTIPLIER: &str = "multiplier";
pub(crate) const JITTER: &str = "jitter";
pub(crate) const DEADLINE: &str = "deadline_ns";
pub(crate) const ON_AMBIGUOUS: &str = "on_ambiguous";
pub(crate) const ACCEPTANCE: &str = "acceptance";
pub(crate) const LEASE_UNTIL: &str = "lease_until";
pub(crate) const NOT_BEFORE: &str = "not_before";
pub(crate) const RESPONSE: &str = "response";
pub(crate) const LAST_ERROR: &str = "last_error";
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const FINISHED_AT: &str = "finished_at";
pub(crate) const EXPIRES_AT: &str = "expires_at";
pub(crate) const ATTEMPT_ID: &str = "attempt_id";
pub(crate) const NUMBER: &str = "number";
pub(crate) const WORKER: &str = "worker";
pub(crate) const STARTED_AT: &str = "started_at";
pub(crate) const OUTCOME: &str = "outcome";
pub(crate) const OPERATION_ID: &str = "operation_id";
pub(crate) const ERROR: &str = "error";
pub(crate) const BUDGET_BASE: &str = "budget_base";
pub(crate) const BUDGET_STARTED_AT: &str = "budget_started_at";
/// Set on a task item by the purge that is removing it (its instant): a
/// reopening refuses such a task, so a purge never deletes history under it.
pub(crate) const PURGING: &str = "purging";
/// The submitter's W3C trace context (`traceparent[;tracestate]`), when it was in a trace.
pub(crate) const TRACE_CONTEXT: &str = "trace_context";
/// How many times the task was reopened: numbers the next reopening item.
pub(crate) const REOPENINGS: &str = "reopenings";
pub(crate) const AT: &str = "at";
pub(crate) const BY: &str = "by";
pub(crate) const REASON: &str = "reason";
pub(crate) const FROM: &str = "from";
/// On a task item, `false` when it was submitted
/// [`without_handoff`](crate::NewTask::without_handoff) (absent: with one).
pub(crate) const HANDOFF: &str = "handoff";
/// On a handoff item: when the dispatcher published it (absent: pending).
pub(crate) const PUBLISHED_AT: &str = "published_at";
// Effect items. `state`, not `status`: `status` keys the status index,
// which holds task items only.
pub(crate) const NAME: &str = "name";
pub(crate) const STATE: &str = "state";
pub(crate) const ATTEMPT: &str = "attempt";
pub(crate) const REFERENCE: &str = "reference";
pub(crate) const AMBIGUOUS: &str = "ambiguous";
pub(crate) const INTENDED_AT: &str = "intended_at";
pub(crate) const SETTLED_AT: &str = "settled_at";
// Limits. On a task item: its concurrency key, the key's limit, its rate
// bucket and its place in the key's submission order.
pub(crate) const CONCURRENCY_KEY: &str = "concurrency_key";
pub(crate) const CONCURRENCY_LIMIT: &str = "concurrency_limit";
pub(crate) const RATE_BUCKET: &str = "rate_bucket";
pub(crate) const KEY_ORDER: &str = "key_order";
// On a key item: the last submission order given, the holders of its slots
// (task id -> the version that holds it), and the order from which its
// unfinished tasks start (every task of a lower order is finished). The
// key item's `version` rises with every claim of the key.
pub(crate) const NEXT_ORDER: &str = "next_order";
pub(crate) const HOLDERS: &str = "holders";
pub(crate) const FIRST_FROM: &str = "first_from";
// On a bucket item (and `name`).
pub(crate) const RATE: &str = "rate";
pub(crate) const PERIOD: &str = "period_ns";
pub(crate) const BURST: &str = "burst";
pub(crate) const SCHEDULE: &str = "schedule";

/// Sort key of a concurrency key's item (partition [`conc_pk`]).
pub(crate) const CONC_SK: &str = "C";
/// Sort key prefix of a concurrency key's member items: one per task of
/// the key, by submission order ([`member_sk`]).
pub(crate) const MEMBER_PREFIX: &str = "O#";
/// Partition key of every bucket item (sort key: the bucket's name), so
/// `buckets` is one query of one partition.
pub(crate) const BUCKETS_PK: &str = "B";

/// An item that does not read back as what it should be.
#[derive(Debug, thiserror::Error)]
#[error("malformed item: {0}")]
pub(crate) struct BadItem(pub(crate) String);

/// Partition key of a task and its attempts.
pub(crate) fn task_pk(id: TaskId) -> String {
    format!("T#{id}")
}

/// Partition key of a dedup record. Each part is length-prefixed so the
/// boundaries count (`("a:b", "c")` and `("a", "b:c")` differ).
pub(crate) fn key_pk(key: &RequestKey) -> String {
    format!(
        "K#{}:{}#{}:{}#{}",
        key.scope.len(),
        key.scope,
        key.operation.len(),
        key.operation,
        key.key
    )
}

/// Partition key of a concurrency key's item and its member items.
pub(crate) fn conc_pk(key: &str) -> String {
    format!("C#{key}")
}

/// Sort key of the member item of the task at `order` in its key's
/// submission order: zero-padded so they sort in order.
pub(crate) fn member_sk(order: u64) -> String {
    format!("{MEMBER_PREFIX}{order:020}")
}

/// Sort key of attempt `number`: zero-padded so they sort in number order.
pub(crate) fn attempt_sk(number: u64) -> String {
    format!("{ATTEMPT_PREFIX}{number:010}")
}

/// Sort key of reopening `number`: zero-padded so they sort in number order.
pub(crate) fn reopening_sk(number: u32) -> String {
    format!("{REOPENING_PREFIX}{number:010}")
}

/// Sort key of effect `name` (names are ASCII letters, digits, `-`, `_`
/// and `.`, so they sort as `MemoryStore` and PostgreSQL sort them).
pub(crate) fn effect_sk(name: &str) -> String {
    format!("{EFFECT_PREFIX}{name}")
}

/// The `unclaimed` index's sort key of a task: its submission instant,
/// zero-padded, then its id, so the index runs in `(created_at, id)` order
/// and `< unclaimed_before(cutoff)` selects exactly `created_at < cutoff`.
pub(crate) fn unclaimed_at(task: &Task) -> AttributeValue {
    s(format!(
        "{:021}#{}",
        task.created_at.unix_timestamp_nanos().max(0),
        task.id
    ))
}

/// The bound of a `stranded` query: every task submitted before `cutoff`
/// sorts below it.
pub(crate) fn unclaimed_before(cutoff: OffsetDateTime) -> AttributeValue {
    s(format!("{:021}", cutoff.unix_timestamp_nanos().max(0)))
}

/// The primary key of an item.
pub(crate) fn key_of(pk: String, sk: &str) -> Item {
    HashMap::from([(PARTITION_KEY.to_owned(), s(pk)), (SORT_KEY.to_owned(), s(sk))])
}

/// The task id a task item's partition key names.
pub(crate) fn task_id_of_pk(pk: &str) -> Result<TaskId, BadItem> {
    pk.strip_prefix("T#")
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| BadItem(format!("not a task key: {pk}")))
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn b(v: impl Into<Vec<u8>>) -> AttributeValue {
    AttributeValue::B(Blob::new(v))
}

/// An instant as Unix nanoseconds.
pub(crate) fn at(t: OffsetDateTime) -> AttributeValue {
    n(t.unix_timestamp_nanos())
}

/// A duration as nanoseconds.
pub(crate) fn nanos(d: Duration) -> AttributeValue {
    n(d.as_nanos())
}

/// The TTL value of an instant: Unix seconds, rounded up.
pub(crate) fn ttl_secs(t: OffsetDateTime) -> AttributeValue {
    let secs = t.unix_timestamp() + i64::from(t.nanosecond() > 0);
    n(secs)
}

/// The items of a new task: its dedup record and the task itself.
pub(crate) fn new_items(task: &Task) -> (Item, Item) {
    let mut key = key_of(key_pk(&task.key), KEY_SK);
    key.insert(TASK_ID.into(), s(task.id.to_string()));
    key.insert(INPUT_HASH.into(), b(task.input_hash.as_bytes().to_vec()));
    key.insert(EXPIRES_AT.into(), at(task.expires_at));

    let mut item = key_of(task_pk(task.id), TASK_SK);
    for (name, value) in [
        (TASK_ID, s(task.id.to_string())),
        (SCOPE, s(&task.key.scope)),
        (OPERATION, s(&task.key.operation)),
        (RKEY, s(&task.key.key)),
        (INPUT_HASH, b(task.input_hash.as_bytes().to_vec())),
        (PAYLOAD, b(task.payload.clone())),
        (STATUS, s(task.status.as_str())),
        (VERSION, n(task.version)),
        (BUDGET_BASE, n(task.budget_base)),
        (BUDGET_STARTED_AT, at(task.budget_started_at)),
        (ACCEPTANCE, s(task.acceptance.as_str())),
        (CREATED_AT, at(task.created_at)),
        (EXPIRES_AT, at(task.expires_at)),
        // Never claimed yet: in the sparse index `stranded` reads.
        (UNCLAIMED_SHARD, s(UNCLAIMED_INDEX)),
        (UNCLAIMED_AT, unclaimed_at(task)),
    ] {
        item.insert(name.into(), value);
    }
    item.extend(
        policy_attributes(&task.policy)
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_owned(), value?))),
    );
    if let Some(cx) = &task.trace_context {
        item.insert(TRACE_CONTEXT.into(), s(cx.to_string()));
    }
    if let Some(key) = &task.limits.concurrency {
        item.insert(CONCURRENCY_KEY.into(), s(key.name()));
        item.insert(CONCURRENCY_LIMIT.into(), n(key.limit()));
    }
    if let Some(bucket) = &task.limits.bucket {
        item.insert(RATE_BUCKET.into(), s(bucket));
    }
    (key, item)
}

/// The attributes of a retry policy; `None`: the attribute is absent (no deadline).
pub(crate) fn policy_attributes(p: &RetryPolicy) -> [(&'static str, Option<AttributeValue>); 7] {
    [
        (MAX_ATTEMPTS, Some(n(p.max_attempts))),
        (INITIAL_BACKOFF, Some(nanos(p.initial_backoff))),
        (MAX_BACKOFF, Some(nanos(p.max_backoff))),
        (MULTIPLIER, Some(s(p.multiplier.to_string()))),
        (JITTER, Some(s(p.jitter.to_string()))),
        (ON_AMBIGUOUS, Some(s(on_ambiguous_name(p.on_ambiguous)))),
        (DEADLINE, p.deadline.map(nanos)),
    ]
}

/// A reopening's item.
pub(crate) fn reopening_item(r: &Reopening) -> Item {
    let mut item = key_of(task_pk(r.task_id), &reopening_sk(r.number));
    for (name, value) in [
        (NUMBER, n(r.number)),
        (AT, at(r.at)),
        (BY, s(&r.by)),
        (REASON, s(&r.reason)),
        (FROM, s(r.from.as_str())),
        (VERSION, n(r.version)),
    ] {
        item.insert(name.into(), value);
    }
    item
}

/// Sort key of a handoff written at `created_at`: the instant, zero-padded,
/// then a fresh UUID v7, so a task's handoffs sort oldest first and two
/// written at one instant (a manual clock) never collide.
pub(crate) fn handoff_sk(created_at: OffsetDateTime) -> String {
    format!(
        "{HANDOFF_PREFIX}{:021}#{}",
        created_at.unix_timestamp_nanos().max(0),
        uuid::Uuid::now_v7()
    )
}

/// A new, unpublished handoff item of task `id`: in the task's partition,
/// and in the `due` index under [`HANDOFF_SHARD`] (oldest first) until it
/// is published.
pub(crate) fn handoff_item(id: TaskId, created_at: OffsetDateTime) -> Item {
    let mut item = key_of(task_pk(id), &handoff_sk(created_at));
    item.insert(CREATED_AT.into(), at(created_at));
    item.insert(DUE_SHARD.into(), s(HANDOFF_SHARD));
    item.insert(DUE_AT.into(), at(created_at));
    item
}

/// Marks a task item as submitted without a handoff: its reopenings and
/// redispatches write none either.
pub(crate) fn set_without_handoff(task: &mut Item) {
    task.insert(HANDOFF.into(), AttributeValue::Bool(false));
}

/// Whether a task item takes handoffs (submitted without
/// [`without_handoff`](crate::NewTask::without_handoff); absent: yes).
pub(crate) fn wants_handoff(task: &Item) -> bool {
    !matches!(task.get(HANDOFF), Some(AttributeValue::Bool(false)))
}

/// A handoff item as a [`Handoff`].
pub(crate) fn handoff(item: &Item) -> Result<Handoff, BadItem> {
    let r = Reader(item);
    Ok(Handoff::new(r.at(CREATED_AT)?, r.opt_at(PUBLISHED_AT)?))
}

/// An effect's item: the whole record, written over the one read.
pub(crate) fn effect_item(e: &Effect) -> Item {
    let mut item = key_of(task_pk(e.task_id), &effect_sk(&e.name));
    for (name, value) in [
        (NAME, s(&e.name)),
        (STATE, s(e.state.as_str())),
        (VERSION, n(e.version)),
        (ATTEMPT, n(e.attempt)),
        (AMBIGUOUS, n(e.ambiguous)),
        (CREATED_AT, at(e.created_at)),
        (INTENDED_AT, at(e.intended_at)),
    ] {
        item.insert(name.into(), value);
    }
    for (name, value) in [
        (REFERENCE, e.reference.as_deref().map(s)),
        (ERROR, e.error.as_deref().map(s)),
        (SETTLED_AT, e.settled_at.map(at)),
    ] {
        if let Some(value) = value {
            item.insert(name.into(), value);
        }
    }
    item
}

/// An effect item as an [`Effect`] of task `task_id`.
pub(crate) fn effect(item: &Item, task_id: TaskId) -> Result<Effect, BadItem> {
    let r = Reader(item);
    let name = r.s(NAME)?;
    let state = r.s(STATE)?;
    Ok(Effect {
        task_id,
        name: name.to_owned(),
        key: EffectKey::new(task_id, name),
        state: EffectState::parse(state).ok_or_else(|| BadItem(format!("unknown effect state {state}")))?,
        version: r.n(VERSION)?,
        attempt: r.n(ATTEMPT)?,
        reference: r.opt_s(REFERENCE).map(str::to_owned),
        error: r.opt_s(ERROR).map(str::to_owned),
        ambiguous: r.n(AMBIGUOUS)?,
        created_at: r.at(CREATED_AT)?,
        intended_at: r.at(INTENDED_AT)?,
        settled_at: r.opt_at(SETTLED_AT)?,
    })
}

/// A new attempt's item.
pub(crate) fn attempt_item(attempt: &Attempt) -> Item {
    let mut item = key_of(task_pk(attempt.task_id), &attempt_sk(u64::from(attempt.number)));
    item.insert(ATTEMPT_ID.into(), s(attempt.id.to_string()));
    item.insert(NUMBER.into(), n(attempt.number));
    item.insert(WORKER.into(), s(&attempt.worker));
    item.insert(STARTED_AT.into(), at(attempt.started_at));
    item
}

fn on_ambiguous_name(o: OnAmbiguous) -> &'static str {
    match o {
        OnAmbiguous::Retry => "retry",
        OnAmbiguous::Stop => "stop",
    }
}

/// Reads one typed attribute of an item.
struct Reader<'a>(&'a Item);

impl Reader<'_> {
    fn get(&self, name: &str) -> Option<&AttributeValue> {
        self.0.get(name)
    }
    fn missing(name: &str) -> BadItem {
        BadItem(format!("attribute {name} missing or of the wrong type"))
    }
    fn opt_s(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.as_s().ok()).map(String::as_str)
    }
    fn s(&self, name: &str) -> Result<&str, BadItem> {
        self.opt_s(name).ok_or_else(|| Self::missing(name))
    }
    fn opt_b(&self, name: &str) -> Option<&[u8]> {
        self.get(name).and_then(|v| v.as_b().ok()).map(Blob::as_ref)
    }
    fn b(&self, name: &str) -> Result<&[u8], BadItem> {
        self.opt_b(name).ok_or_else(|| Self::missing(name))
    }
    fn opt_n<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, BadItem> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_n()
                .ok()
                .and_then(|n| n.parse().ok())
                .map(Some)
                .ok_or_else(|| Self::missing(name)),
        }
    }
    fn n<T: std::str::FromStr>(&self, name: &str) -> Result<T, BadItem> {
        self.opt_n(name)?.ok_or_else(|| Self::missing(name))
    }
    fn opt_at(&self, name: &str) -> Result<Option<OffsetDateTime>, BadItem> {
        self.opt_n::<i128>(name)?
            .map(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).map_err(|_| Self::missing(name)))
            .transpose()
    }
    fn at(&self, name: &str) -> Result<OffsetDateTime, BadItem> {
        self.opt_at(name)?.ok_or_else(|| Self::missing(name))
    }
    fn duration(&self, name: &str) -> Result<Option<Duration>, BadItem> {
        Ok(self
            .opt_n::<u128>(name)?
            .map(|ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))))
    }
    fn float(&self, name: &str) -> Result<f64, BadItem> {
        self.s(name)?.parse().map_err(|_| Self::missing(name))
    }
}

/// A task item (also the `ALL_OLD` image of a refused write) as a [`Task`].
pub(crate) fn task(item: &Item) -> Result<Task, BadItem> {
    let r = Reader(item);
    let hash: [u8; 32] = r
        .b(INPUT_HASH)?
        .try_into()
        .map_err(|_| BadItem("input_hash is not 32 bytes".into()))?;
    let status = r.s(STATUS)?;
    let on_ambiguous = match r.s(ON_AMBIGUOUS)? {
        "stop" => OnAmbiguous::Stop,
        _ => OnAmbiguous::Retry,
    };
    Ok(Task {
        id: r.s(TASK_ID)?.parse().map_err(|_| Reader::missing(TASK_ID))?,
        key: RequestKey::new(r.s(SCOPE)?, r.s(OPERATION)?, r.s(RKEY)?),
        input_hash: InputHash::from_bytes(hash),
        payload: r.opt_b(PAYLOAD).unwrap_or_default().to_vec(),
        status: status.parse::<Status>().map_err(|e| BadItem(e.to_string()))?,
        version: r.n(VERSION)?,
        policy: RetryPolicy {
            max_attempts: r.n(MAX_ATTEMPTS)?,
            initial_backoff: r
                .duration(INITIAL_BACKOFF)?
                .ok_or_else(|| Reader::missing(INITIAL_BACKOFF))?,
            max_backoff: r
                .duration(MAX_BACKOFF)?
                .ok_or_else(|| Reader::missing(MAX_BACKOFF))?,
            multiplier: r.float(MULTIPLIER)?,
            jitter: r.float(JITTER)?,
            deadline: r.duration(DEADLINE)?,
            on_ambiguous,
        },
        // Absent on items written before the budget attributes: the first budget.
        budget_base: r.opt_n(BUDGET_BASE)?.unwrap_or(0),
        budget_started_at: match r.opt_at(BUDGET_STARTED_AT)? {
            Some(started) => started,
            None => r.at(CREATED_AT)?,
        },
        acceptance: AcceptanceRule::parse(r.s(ACCEPTANCE)?).ok_or_else(|| Reader::missing(ACCEPTANCE))?,
        lease_until: r.opt_at(LEASE_UNTIL)?,
        not_before: r.opt_at(NOT_BEFORE)?,
        response: r.opt_b(RESPONSE).map(|bytes| Response::new(bytes.to_vec())),
        last_error: r.opt_s(LAST_ERROR).map(str::to_owned),
        created_at: r.at(CREATED_AT)?,
        finished_at: r.opt_at(FINISHED_AT)?,
        expires_at: r.at(EXPIRES_AT)?,
        trace_context: r
            .opt_s(TRACE_CONTEXT)
            .map(|cx| cx.parse().map_err(|e| BadItem(format!("trace_context: {e}"))))
            .transpose()?,
        // Absent on items written before limits: none.
        limits: TaskLimits {
            concurrency: match r.opt_s(CONCURRENCY_KEY) {
                Some(key) => Some(ConcurrencyKey::new(key, r.n(CONCURRENCY_LIMIT)?)),
                None => None,
            },
            bucket: r.opt_s(RATE_BUCKET).map(str::to_owned),
        },
    })
}

/// A task item's place in its key's submission order (absent: no key).
pub(crate) fn key_order(item: &Item) -> Result<Option<u64>, BadItem> {
    Reader(item).opt_n(KEY_ORDER)
}

/// A bucket's item: its definition, keyed in the buckets' partition (the
/// schedule is the claims' and drains' to write).
pub(crate) fn bucket_key(name: &str) -> Item {
    key_of(BUCKETS_PK.to_owned(), name)
}

/// A bucket item as a [`BucketState`].
pub(crate) fn bucket(item: &Item) -> Result<BucketState, BadItem> {
    let r = Reader(item);
    let period = r.duration(PERIOD)?.ok_or_else(|| Reader::missing(PERIOD))?;
    Ok(BucketState {
        bucket: RateBucket::new(r.s(NAME)?, r.n(RATE)?, period).burst(r.n(BURST)?),
        schedule: r.opt_at(SCHEDULE)?,
    })
}

/// A concurrency key's item as read.
#[derive(Debug, Default)]
pub(crate) struct KeyItem {
    /// Raised by every claim of the key's tasks (0: never claimed).
    pub(crate) version: u64,
    /// The holders of its slots: task id and the version that claimed it, by id.
    pub(crate) holders: Vec<(TaskId, u64)>,
    /// Every task of the key below this order is finished.
    pub(crate) first_from: u64,
    /// The last submission order given (0: none).
    pub(crate) next_order: u64,
}

/// A key item as a [`KeyItem`].
pub(crate) fn key_item(item: &Item) -> Result<KeyItem, BadItem> {
    let r = Reader(item);
    let mut holders = Vec::new();
    if let Some(map) = item.get(HOLDERS).and_then(|v| v.as_m().ok()) {
        for (id, version) in map {
            let id = id
                .parse()
                .map_err(|_| BadItem(format!("holder {id} is not a task id")))?;
            let version = version
                .as_n()
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Reader::missing(HOLDERS))?;
            holders.push((id, version));
        }
    }
    holders.sort_unstable();
    Ok(KeyItem {
        version: r.opt_n(VERSION)?.unwrap_or(0),
        holders,
        first_from: r.opt_n(FIRST_FROM)?.unwrap_or(0),
        next_order: r.opt_n(NEXT_ORDER)?.unwrap_or(0),
    })
}

/// What decides whether a task item, read with [`SLOT_ATTRIBUTES`] only,
/// holds a slot: its id, status and lease expiry.
pub(crate) fn slot(item: &Item) -> Result<(TaskId, Status, Option<OffsetDateTime>), BadItem> {
    let r = Reader(item);
    let pk = r.s(PARTITION_KEY)?;
    Ok((
        task_id_of_pk(pk)?,
        r.s(STATUS)?
            .parse::<Status>()
            .map_err(|e| BadItem(e.to_string()))?,
        r.opt_at(LEASE_UNTIL)?,
    ))
}

/// The attributes [`slot`] reads.
pub(crate) const SLOT_ATTRIBUTES: [&str; 3] = [PARTITION_KEY, STATUS, LEASE_UNTIL];

/// A member item's order and task id.
pub(crate) fn member(item: &Item) -> Result<(u64, TaskId), BadItem> {
    let r = Reader(item);
    let id = r.s(TASK_ID)?.parse().map_err(|_| Reader::missing(TASK_ID))?;
    Ok((r.n(KEY_ORDER)?, id))
}

/// An attempt item as an [`Attempt`]. No `outcome` attribute means it is still running.
pub(crate) fn attempt(item: &Item, task_id: TaskId) -> Result<Attempt, BadItem> {
    let r = Reader(item);
    let outcome = match r.opt_s(OUTCOME) {
        None => AttemptOutcome::Running,
        Some(o) => AttemptOutcome::parse(o).ok_or_else(|| BadItem(format!("unknown outcome {o}")))?,
    };
    Ok(Attempt {
        id: r
            .s(ATTEMPT_ID)?
            .parse::<AttemptId>()
            .map_err(|_| Reader::missing(ATTEMPT_ID))?,
        task_id,
        number: r.n(NUMBER)?,
        worker: r.s(WORKER)?.to_owned(),
        started_at: r.at(STARTED_AT)?,
        finished_at: r.opt_at(FINISHED_AT)?,
        outcome,
        operation_id: r.opt_s(OPERATION_ID).map(str::to_owned),
        error: r.opt_s(ERROR).map(str::to_owned),
    })
}

/// How many times a task item was reopened (absent: never).
/// Whether a purge has claimed the task item ([`PURGING`]).
pub(crate) fn purging(item: &Item) -> bool {
    item.contains_key(PURGING)
}

pub(crate) fn reopenings(item: &Item) -> Result<u32, BadItem> {
    Ok(Reader(item).opt_n(REOPENINGS)?.unwrap_or(0))
}

/// A reopening item as a [`Reopening`].
pub(crate) fn reopening(item: &Item, task_id: TaskId) -> Result<Reopening, BadItem> {
    let r = Reader(item);
    Ok(Reopening {
        task_id,
        number: r.n(NUMBER)?,
        at: r.at(AT)?,
        by: r.s(BY)?.to_owned(),
        reason: r.s(REASON)?.to_owned(),
        from: r.s(FROM)?.parse::<Status>().map_err(|e| BadItem(e.to_string()))?,
        version: r.n(VERSION)?,
    })
}

/// A dedup record's task id and input hash.
pub(crate) fn dedup(item: &Item) -> Result<(TaskId, InputHash), BadItem> {
    let r = Reader(item);
    let id = r.s(TASK_ID)?.parse().map_err(|_| Reader::missing(TASK_ID))?;
    let hash: [u8; 32] = r
        .b(INPUT_HASH)?
        .try_into()
        .map_err(|_| BadItem("input_hash is not 32 bytes".into()))?;
    Ok((id, InputHash::from_bytes(hash)))
}

/// The request key a purge index entry carries.
pub(crate) fn request_key(item: &Item) -> Result<RequestKey, BadItem> {
    let r = Reader(item);
    Ok(RequestKey::new(r.s(SCOPE)?, r.s(OPERATION)?, r.s(RKEY)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_reads_back_as_written() {
        let now = OffsetDateTime::from_unix_timestamp_nanos(1_767_225_600_123_456_789).unwrap();
        let task = Task {
            id: TaskId::new(),
            key: RequestKey::new("user:1", "chat.reply", "k#1"),
            input_hash: InputHash::of(["x"]),
            payload: b"a\0b".to_vec(),
            status: Status::Pending,
            version: 0,
            policy: RetryPolicy::default()
                .multiplier(1.1)
                .jitter(0.3)
                .deadline(Duration::from_secs(7)),
            budget_base: 0,
            budget_started_at: now,
            acceptance: AcceptanceRule::FirstValidAnswer,
            lease_until: None,
            not_before: None,
            response: None,
            last_error: None,
            created_at: now,
            finished_at: None,
            expires_at: now + Duration::from_secs(60),
            trace_context: Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01;a=1"
                    .parse()
                    .unwrap(),
            ),
            limits: TaskLimits::default(),
        };
        let (key, item) = new_items(&task);
        assert_eq!(self::task(&item).unwrap(), task);
        assert_eq!(dedup(&key).unwrap(), (task.id, task.input_hash));
        assert_ne!(
            key_pk(&RequestKey::new("a:b", "c", "d")),
            key_pk(&RequestKey::new("a", "b:c", "d"))
        );
        assert!(attempt_sk(2) < attempt_sk(10));
        assert!(reopening_sk(2) < reopening_sk(10));

        // Handoffs sort by instant, before the task item, and read back.
        assert!(handoff_sk(now) < handoff_sk(now + Duration::from_nanos(1)));
        assert_ne!(handoff_sk(now), handoff_sk(now));
        assert!(handoff_sk(now).as_str() < TASK_SK && handoff_sk(now).starts_with(HANDOFF_PREFIX));
        let h = handoff_item(task.id, now);
        assert_eq!(handoff(&h).unwrap(), Handoff::new(now, None));
        let (_, mut t) = new_items(&task);
        assert!(wants_handoff(&t));
        set_without_handoff(&mut t);
        assert!(!wants_handoff(&t));

        // An effect reads back as written, intended and settled, and its
        // item sorts before the task item (a purge takes it).
        let mut e = Effect::intended(task.id, "notify-user", 2, 2, now);
        e.ambiguous = 1;
        assert_eq!(effect(&effect_item(&e), task.id).unwrap(), e);
        crate::effect::EffectOutcome::done("msg-1").apply(&mut e, now + Duration::from_nanos(7));
        assert_eq!(effect(&effect_item(&e), task.id).unwrap(), e);
        crate::effect::EffectOutcome::failed("declined").apply(&mut e, now);
        assert_eq!(effect(&effect_item(&e), task.id).unwrap(), e);
        assert!(effect_sk("z").as_str() < TASK_SK && !effect_item(&e).contains_key(STATUS));

        // A later budget reads back; an item from before the budget
        // attributes reads as its first budget.
        let mut reopened = task.clone();
        (reopened.version, reopened.budget_base) = (3, 3);
        reopened.budget_started_at = now + Duration::from_secs(5);
        let (_, item) = new_items(&reopened);
        assert_eq!(self::task(&item).unwrap(), reopened);
        let mut old = item.clone();
        old.remove(BUDGET_BASE);
        old.remove(BUDGET_STARTED_AT);
        let old = self::task(&old).unwrap();
        assert_eq!((old.budget_base, old.budget_started_at), (0, old.created_at));
        assert_eq!(reopenings(&item).unwrap(), 0);

        // A task's limits read back; a key item and a bucket item read back.
        let mut keyed = task.clone();
        keyed.limits = TaskLimits {
            concurrency: Some(ConcurrencyKey::new("conversation-7", 1)),
            bucket: Some("provider".into()),
        };
        let (_, item) = new_items(&keyed);
        assert_eq!(self::task(&item).unwrap(), keyed);
        assert!(member_sk(2) < member_sk(10) && member_sk(u64::MAX).len() == member_sk(0).len());
        let holder = TaskId::new();
        let key = HashMap::from([
            (VERSION.to_owned(), n(3)),
            (
                HOLDERS.to_owned(),
                AttributeValue::M(HashMap::from([(holder.to_string(), n(2))])),
            ),
            (NEXT_ORDER.to_owned(), n(7)),
        ]);
        let read = key_item(&key).unwrap();
        assert_eq!(
            (read.version, read.holders, read.first_from, read.next_order),
            (3, vec![(holder, 2)], 0, 7)
        );
        let mut bucket_item = bucket_key("provider");
        bucket_item.insert(NAME.into(), s("provider"));
        bucket_item.insert(RATE.into(), n(60));
        bucket_item.insert(PERIOD.into(), nanos(Duration::from_secs(60)));
        bucket_item.insert(BURST.into(), n(2));
        let state = bucket(&bucket_item).unwrap();
        assert_eq!(state.bucket, RateBucket::per_minute("provider", 60).burst(2));
        assert_eq!(state.schedule, None);

        // The unclaimed index's order is (created_at, id), its bound exact.
        let later = Task {
            created_at: now + Duration::from_nanos(1),
            ..task.clone()
        };
        let key = |t: &Task| unclaimed_at(t).as_s().unwrap().clone();
        let bound = |t: OffsetDateTime| unclaimed_before(t).as_s().unwrap().clone();
        assert!(key(&task) < key(&later));
        assert!(key(&task) < bound(later.created_at));
        assert!(
            key(&later) >= bound(later.created_at),
            "created_at < cutoff, strictly"
        );
    }
}
