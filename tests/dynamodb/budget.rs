//! The retry budget's attributes on DynamoDB: a task item written before
//! `budget_base` / `budget_started_at` existed reads as its first budget and
//! every conditional write still passes on it; a reopened one is decided on
//! its fresh budget.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::types::AttributeValue;
use taskfence::store::ReopenRequest;
use taskfence::testing::{DynamoFixture, Fixture, acquire, new_task};
use taskfence::{Claim, ClaimRequest, Failure, Response, RetryPolicy, Status, TaskId, TaskStore};
use taskfence_test_support::dynamo;

const LEASE: Duration = Duration::from_secs(30);

/// Removes the budget attributes from a task item, as an older version wrote it.
async fn make_old(f: &DynamoFixture, id: TaskId) {
    f.dynamo_store()
        .client()
        .update_item()
        .table_name(f.table())
        .key("pk", AttributeValue::S(format!("T#{id}")))
        .key("sk", AttributeValue::S("T".into()))
        .update_expression("REMOVE budget_base, budget_started_at")
        .send()
        .await
        .expect("remove the budget attributes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_without_budget_attributes_read_as_the_first_budget() {
    let f = dynamo::fixture().await;
    let store = f.store();
    let task = store
        .submit(new_task("old").policy(RetryPolicy::default().max_attempts(2).jitter(0.0)))
        .await
        .unwrap()
        .into_task();
    make_old(&f, task.id).await;
    let read = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(read, task, "budget_base 0, budget_started_at = created_at");

    // Every decision's condition passes on the old item: claim, fail, claim, complete.
    let lease = acquire(&*store, task.id, "a").await;
    make_old(&f, task.id).await;
    assert!(
        store
            .fail(lease, Failure::retryable("busy"))
            .await
            .unwrap()
            .is_accepted()
    );
    make_old(&f, task.id).await;
    f.advance(Duration::from_secs(2)).await;
    let lease = acquire(&*store, task.id, "b").await;
    make_old(&f, task.id).await;
    assert!(
        store
            .complete(lease, Response::from("ok"))
            .await
            .unwrap()
            .is_accepted()
    );

    // Cancel and reopen an old item too.
    let other = store.submit(new_task("old-2")).await.unwrap().into_task();
    make_old(&f, other.id).await;
    assert!(store.cancel(other.id, "stop").await.unwrap().is_accepted());
    make_old(&f, other.id).await;
    let reopened = store
        .reopen(other.id, ReopenRequest::new("ops", "again"))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    assert_eq!(store.get(other.id).await.unwrap().unwrap(), reopened);
}

/// Runs a hook once, just before the client's first `TransactWriteItems`
/// goes out: another writer's requests land between a read and its write.
#[derive(Clone, Default)]
struct BeforeFirstWrite(Arc<Mutex<Option<Hook>>>);

type Hook = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for BeforeFirstWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeFirstWrite")
    }
}

impl Intercept for BeforeFirstWrite {
    fn name(&self) -> &'static str {
        "BeforeFirstWrite"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let target = context.request().headers().get("x-amz-target").unwrap_or("");
        if target.ends_with("TransactWriteItems")
            && let Some(hook) = self.0.lock().unwrap().take()
        {
            hook();
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_decided_on_the_spent_budget_does_not_fail_the_reopened_task() {
    // The budget is part of every condition: a claim that read the spent
    // budget, then lost the race to a cancel and a reopening (the same version,
    // the same status again), must decide again on the fresh budget instead
    // of marking the reopened task failed.
    let f = dynamo::fixture().await;
    let store = f.store();
    let task = store
        .submit(new_task("spent").policy(RetryPolicy::default().max_attempts(1)))
        .await
        .unwrap()
        .into_task();
    let lease = acquire(&*store, task.id, "a").await;
    assert!(store.release(lease).await.unwrap().is_accepted());
    let spent = store.get(task.id).await.unwrap().unwrap();
    assert_eq!((spent.status, spent.attempts_left()), (Status::Pending, 0));

    let hook = BeforeFirstWrite::default();
    let (operator, id) = (store.clone(), task.id);
    *hook.0.lock().unwrap() = Some(Box::new(move || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                assert!(operator.cancel(id, "operator").await.unwrap().is_accepted());
                assert!(
                    operator
                        .reopen(id, ReopenRequest::new("ops", "again"))
                        .await
                        .unwrap()
                        .is_accepted()
                );
            });
        });
    }));
    let config = dynamo::client()
        .config()
        .to_builder()
        .interceptor(hook.clone())
        .build();
    let racing = taskfence::DynamoStore::builder(aws_sdk_dynamodb::Client::from_conf(config), f.table())
        .clock(f.clock().clone())
        .build()
        .unwrap();
    let claim = racing
        .claim(task.id, ClaimRequest::new("b", LEASE))
        .await
        .unwrap();
    assert!(
        hook.0.lock().unwrap().is_none(),
        "the cancel and reopening ran in between"
    );
    let Claim::Acquired(lease) = claim else {
        panic!("decided on the spent budget after the reopening: {claim:?}")
    };
    assert_eq!((lease.version(), lease.task().budget_base), (2, 1));
    let stored = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.version, stored.attempts_left()),
        (Status::Running, 2, 0)
    );
}
