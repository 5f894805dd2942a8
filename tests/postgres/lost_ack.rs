//! The save succeeded but its acknowledgement was lost: a proxy between the
//! worker and the server lets the completion commit, swallows the reply and
//! cuts the connection. The worker sees an error; the durable task says done.

use crate::common;

use std::time::Duration;

use common::WireProxy;
use taskfence::{Claim, ClaimRequest, Error, Response, Status, TaskStore};

const LEASE: Duration = Duration::from_secs(30);

use common::new_task;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_succeeded_but_ack_lost_reread_shows_completed_and_claim_returns_it() {
    let f = common::fixture().await;
    let direct = f.pg_store().clone();
    let proxy = WireProxy::start(f.url()).await;
    let worker = proxy.store(&f, 1).await;

    // The worker holds its connection (no pool traffic in between), and the
    // completion statement is prepared on it first, so the lost reply below
    // is the reply to the completion's execution itself.
    let mut conn = worker.pool().acquire().await.unwrap();
    let warm = worker
        .on(&mut conn)
        .submit(new_task("warm-up"))
        .await
        .unwrap()
        .into_task();
    let Claim::Acquired(lease) = worker
        .on(&mut conn)
        .claim(warm.id, ClaimRequest::new("w", LEASE))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    assert!(
        worker
            .on(&mut conn)
            .complete(lease, Response::from("warm"))
            .await
            .unwrap()
            .is_accepted()
    );

    let task = worker
        .on(&mut conn)
        .submit(new_task("k"))
        .await
        .unwrap()
        .into_task();
    let Claim::Acquired(lease) = worker
        .on(&mut conn)
        .claim(task.id, ClaimRequest::new("w", LEASE))
        .await
        .unwrap()
    else {
        panic!("fresh task")
    };
    proxy.lose_next_reply();
    let err = worker
        .on(&mut conn)
        .complete(lease, Response::from("the answer"))
        .await
        .expect_err("the reply was lost on the way back");
    assert!(matches!(err, Error::Storage(_)) && err.is_retryable(), "{err:?}");
    drop(conn);

    // Read the durable task before deciding to generate again.
    let saved = direct.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (saved.status, saved.response),
        (Status::Completed, Some(Response::from("the answer")))
    );
    match direct
        .claim(task.id, ClaimRequest::new("redelivered", LEASE))
        .await
        .unwrap()
    {
        Claim::Completed(done) => assert_eq!(done.response, Some(Response::from("the answer"))),
        other => panic!("expected Completed, got {other:?}"),
    }
    assert_eq!(direct.attempts(task.id).await.unwrap().len(), 1, "no new attempt");
    assert_eq!(direct.get(task.id).await.unwrap().unwrap().version, 1);
}
