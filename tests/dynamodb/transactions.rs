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
