//! The application's own writes in the task's transaction:
//! `DynamoStore::with(items)`: a submission or a completion and the
//! application's own items commit both or neither.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TransactWriteItem,
};
use taskfence::dynamodb::ExtraRefused;
use taskfence::store::AttemptOutcome;
use taskfence::testing::{DynamoFixture, Fixture, acquire, new_task};
use taskfence::{Error, Rejection, Response, Status, TaskStore};
use taskfence_test_support::dynamo;

/// The application's own table (`id` string key), deleted at the end of the test.
struct AppTable {
    client: Client,
    name: String,
}

impl AppTable {
    async fn new(f: &DynamoFixture) -> Self {
        let name = format!("{}_app", f.table());
        let client = dynamo::client();
        client
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("id")
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("id")
                    .key_type(KeyType::Hash)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .expect("create the application's table");
        Self { client, name }
    }

    /// A put of `id` that refuses to overwrite it.
    fn put_new(&self, id: &str, body: &str) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.name)
            .item("id", AttributeValue::S(id.to_owned()))
            .item("body", AttributeValue::S(body.to_owned()))
            .condition_expression("attribute_not_exists(id)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .unwrap();
        TransactWriteItem::builder().put(put).build()
    }

    async fn body(&self, id: &str) -> Option<String> {
        let out = self
            .client
            .get_item()
            .table_name(&self.name)
            .key("id", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        out.item()
            .and_then(|i| i.get("body"))
            .and_then(|b| b.as_s().ok())
            .cloned()
    }

    async fn delete(self) {
        self.client
            .delete_table()
            .table_name(&self.name)
            .send()
            .await
            .unwrap();
    }
}

fn extra_refused<T: std::fmt::Debug>(r: &taskfence::Result<T>) -> Option<usize> {
    match r {
        Err(err @ Error::ItemRefused(e)) => {
            assert!(!err.is_retryable(), "the same items are refused again: {err}");
            e.downcast_ref::<ExtraRefused>().map(|x| x.index)
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_commits_with_the_applications_items_or_not_at_all() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let app = AppTable::new(&f).await;

    // Commit: the message and the task.
    let task = store
        .with(vec![app.put_new("msg-1", "hello")])
        .submit(new_task("send-1"))
        .await
        .unwrap()
        .into_task();
    assert_eq!(app.body("msg-1").await.as_deref(), Some("hello"));
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    let before = f.record_count().await;

    // Rollback: the application's condition fails (the message exists), so no task.
    let refused = store
        .with(vec![app.put_new("msg-1", "overwritten?")])
        .submit(new_task("send-2"))
        .await;
    assert_eq!(extra_refused(&refused), Some(0), "{refused:?}");
    assert_eq!(f.record_count().await, before, "nothing of the task was written");
    assert!(store.find(&new_task("send-2").key).await.unwrap().is_none());
    assert_eq!(app.body("msg-1").await.as_deref(), Some("hello"));

    // A repeated submission is the same task and writes none of the extras.
    let again = store
        .with(vec![app.put_new("msg-2", "duplicate")])
        .submit(new_task("send-1"))
        .await
        .unwrap();
    assert!(!again.is_created());
    assert_eq!(again.task().id, task.id);
    assert_eq!(app.body("msg-2").await, None);
    app.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_commits_with_the_applications_items_or_not_at_all() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let app = AppTable::new(&f).await;
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let lease = acquire(store, task.id, "a").await;

    // Rollback: the reply's own condition fails, so the task is not completed.
    app.client
        .put_item()
        .table_name(&app.name)
        .item("id", AttributeValue::S("reply-1".into()))
        .item("body", AttributeValue::S("someone else's".into()))
        .send()
        .await
        .unwrap();
    let before = store.get(task.id).await.unwrap().unwrap();
    let refused = store
        .with(vec![app.put_new("reply-1", "mine")])
        .complete(lease.clone(), Response::from("mine"))
        .await;
    assert_eq!(extra_refused(&refused), Some(0), "{refused:?}");
    assert_eq!(
        store.get(task.id).await.unwrap().unwrap(),
        before,
        "the task is unchanged"
    );
    assert_eq!(
        store.attempts(task.id).await.unwrap()[0].outcome,
        AttemptOutcome::Running
    );

    // Commit: a fresh reply id, the reply and the completion together.
    let saved = store
        .with(vec![app.put_new("reply-2", "mine")])
        .complete(lease.clone(), Response::from("mine"))
        .await
        .unwrap();
    assert!(saved.is_accepted());
    assert_eq!(app.body("reply-2").await.as_deref(), Some("mine"));
    let done = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (done.status, done.response),
        (Status::Completed, Some(Response::from("mine")))
    );

    // A refused completion writes none of the extras.
    let late = store
        .with(vec![app.put_new("reply-3", "again")])
        .complete(lease, Response::from("again"))
        .await
        .unwrap();
    assert!(matches!(
        late,
        taskfence::Fenced::Rejected(Rejection::AlreadyCompleted(_))
    ));
    assert_eq!(app.body("reply-3").await, None);
    app.delete().await;
}

/// `with(items).write(&lease)`: the application's own items written while
/// working land only under a current lease; after a takeover they are refused
/// with the reason, and nothing is written. `fence_item` puts the same check
/// into a transaction the application sends itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_writes_land_only_under_a_current_lease() {
    let f = dynamo::fixture().await;
    let app = AppTable::new(&f).await;
    let store = f.dynamo_store();
    let task = store.submit(new_task("send-1")).await.unwrap().into_task();
    let paused = acquire(store, task.id, "paused").await;

    let written = store
        .with(vec![app.put_new("progress-1", "step 1")])
        .write(&paused)
        .await
        .unwrap();
    assert!(written.is_accepted());
    assert_eq!(app.body("progress-1").await.as_deref(), Some("step 1"));
    let refused = store
        .with(vec![app.put_new("progress-1", "again")])
        .write(&paused)
        .await;
    assert_eq!(
        extra_refused(&refused),
        Some(0),
        "the application's own condition, typed"
    );

    // Paused past its lease; another worker takes over.
    f.advance(std::time::Duration::from_secs(31)).await;
    let fresh = acquire(store, task.id, "fresh").await;
    let late = store
        .with(vec![app.put_new("progress-2", "stale")])
        .write(&paused)
        .await
        .unwrap();
    assert_eq!(
        late.rejection(),
        Some(&Rejection::Superseded { current_version: 2 })
    );
    assert_eq!(
        app.body("progress-2").await,
        None,
        "nothing of the paused worker's was written"
    );

    // The same check inside a transaction the application sends itself.
    let own = |lease| {
        let items = vec![app.put_new("progress-3", "own"), store.fence_item(lease)];
        app.client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
    };
    assert!(own(&paused).await.is_err(), "the superseded lease cancels it");
    assert_eq!(app.body("progress-3").await, None);
    own(&fresh).await.expect("the current lease lets it through");
    assert_eq!(app.body("progress-3").await.as_deref(), Some("own"));

    assert!(
        store
            .complete(fresh, Response::from("done"))
            .await
            .unwrap()
            .is_accepted()
    );
    app.delete().await;
}

/// The handle is a `TaskStore`: `fail`, `release` and `record_operation`
/// carry the items like `submit` and `complete` (both or neither), and the
/// reads run on the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_release_and_record_operation_carry_the_items_or_write_nothing() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let app = AppTable::new(&f).await;
    let task = store.submit(new_task("k1")).await.unwrap().into_task();

    let lease = acquire(store, task.id, "w1").await;
    let handle = store.with(vec![app.put_new("op-1", "provider call")]);
    assert!(
        handle
            .record_operation(&lease, "resp_1")
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(app.body("op-1").await.as_deref(), Some("provider call"));
    assert_eq!(
        handle.get(task.id).await.unwrap().unwrap().status,
        Status::Running,
        "reads run on the store"
    );
    assert_eq!(
        store.attempts(task.id).await.unwrap()[0].operation_id.as_deref(),
        Some("resp_1")
    );

    let released = store
        .with(vec![app.put_new("release-1", "handed back")])
        .release(lease.clone())
        .await
        .unwrap();
    assert!(released.is_accepted());
    assert_eq!(app.body("release-1").await.as_deref(), Some("handed back"));

    // A refused write (the lease was released) writes none of the items.
    let stale = store
        .with(vec![app.put_new("fail-stale", "late")])
        .fail(lease, taskfence::Failure::retryable("429"))
        .await
        .unwrap();
    assert!(stale.rejection().is_some(), "{stale:?}");
    assert_eq!(app.body("fail-stale").await, None, "nothing of a refused write");

    let lease = acquire(store, task.id, "w2").await;
    let failed = store
        .with(vec![app.put_new("fail-1", "gave up")])
        .fail(lease, taskfence::Failure::permanent("bad input"))
        .await
        .unwrap();
    assert!(failed.is_accepted());
    assert_eq!(app.body("fail-1").await.as_deref(), Some("gave up"));
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Failed);
    app.delete().await;
}

/// What no single `TransactWriteItems` with the items can make is refused
/// with `InvalidInput::CannotCarryItems`, writes nothing and leaves the items
/// for the next write; the items go with one write only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_that_cannot_carry_the_items_are_refused_and_write_nothing() {
    use std::time::Duration;
    use taskfence::error::InvalidInput;
    use taskfence::{ClaimNext, ClaimRequest};

    fn cannot_carry<T: std::fmt::Debug>(r: taskfence::Result<T>, op: &str) {
        match r {
            Err(Error::InvalidInput(InvalidInput::CannotCarryItems { operation, .. })) => {
                assert_eq!(operation, op);
            }
            other => panic!("{op}: expected CannotCarryItems, got {other:?}"),
        }
    }

    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let app = AppTable::new(&f).await;
    let task = store.submit(new_task("k1")).await.unwrap().into_task();
    let other = store.submit(new_task("k2")).await.unwrap().into_task();
    let mut lease = acquire(store, task.id, "w").await;
    let before = f.record_count().await;
    let request = || ClaimRequest::new("w", Duration::from_secs(30));

    let handle = store.with(vec![app.put_new("reply-1", "mine")]);
    cannot_carry(handle.claim(other.id, request()).await, "claim");
    cannot_carry(handle.claim_many(&[other.id], request()).await, "claim_many");
    cannot_carry(
        handle
            .claim_next(ClaimNext::new("w", Duration::from_secs(30), 1))
            .await,
        "claim_next",
    );
    cannot_carry(handle.renew(&mut lease, Duration::from_secs(30)).await, "renew");
    cannot_carry(
        handle
            .renew_many(std::slice::from_mut(&mut lease), Duration::from_secs(30))
            .await,
        "renew_many",
    );
    cannot_carry(handle.cancel(other.id, "no").await, "cancel");
    cannot_carry(
        handle
            .reopen(other.id, taskfence::store::ReopenRequest::new("op", "why"))
            .await,
        "reopen",
    );
    cannot_carry(handle.begin_effect(&lease, "notify").await, "begin_effect");
    cannot_carry(
        handle
            .finish_effect(&lease, "notify", taskfence::effect::EffectOutcome::done("x"))
            .await,
        "finish_effect",
    );
    cannot_carry(
        handle
            .complete_many(vec![(lease.clone(), Response::from("a"))])
            .await,
        "complete_many",
    );
    cannot_carry(handle.purge_expired(10).await, "purge_expired");
    assert_eq!(
        f.record_count().await,
        before,
        "no refused operation wrote anything"
    );
    assert_eq!(app.body("reply-1").await, None);
    assert_eq!(
        store.get(other.id).await.unwrap().unwrap().status,
        Status::Pending
    );

    // The items are still there for the one write that carries them…
    let saved = handle
        .complete(lease.clone(), Response::from("answer"))
        .await
        .unwrap();
    assert!(saved.is_accepted());
    assert_eq!(app.body("reply-1").await.as_deref(), Some("mine"));
    // …and only for it.
    cannot_carry(handle.submit(new_task("k3")).await, "submit");
    assert!(store.find(&new_task("k3").key).await.unwrap().is_none());
    app.delete().await;
}

/// Code written against any store — here `metrics::observe` — makes the
/// write that carries the items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_handle_carries_the_items() {
    let f = dynamo::fixture().await;
    let store = f.dynamo_store();
    let app = AppTable::new(&f).await;
    let observed = taskfence::metrics::observe(store.with(vec![app.put_new("msg-1", "hello")]));
    let as_store: &dyn TaskStore = &observed;
    let task = as_store.submit(new_task("send-1")).await.unwrap().into_task();
    assert_eq!(app.body("msg-1").await.as_deref(), Some("hello"));
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    app.delete().await;
}
