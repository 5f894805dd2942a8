//! The retention sweep: a finished reply task past its retention is purged
//! by the running service (its key is then free again), and the sweep stops
//! with the service.

mod support;

use std::time::Duration;

use chat_api::Mode;
use support::{ALICE, TestDb, TestService, config, ids};
use taskfence::TaskId;
use taskfence::testing::Fixture;
use taskfence_test_support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_retention_is_purged_by_the_running_service() {
    let db = TestDb::new().await;
    let mut config = config(&db, Mode::Both);
    config.key_retention = Duration::from_secs(2);
    config.purge.every = Duration::from_millis(200);
    config.purge.batch = 1;
    let service = TestService::start_with(&db, config).await;
    let api = service.api().clone();

    // Three replies saved; their tasks expire two seconds after submission.
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (task_id, _) = ids(&api
            .send(ALICE, "conv-1", Some(&format!("send-{i}")), "Hello?")
            .await);
        let view = api.wait_for_reply(ALICE, &task_id).await;
        assert_eq!(view["status"], "completed");
        tasks.push(task_id.parse::<TaskId>().unwrap());
    }
    let store = db.fixture.store();
    for &id in &tasks {
        assert!(
            store.get(id).await.unwrap().is_some(),
            "kept within its retention"
        );
    }

    // Gone once past it: a batch of 1 drains all three in one sweep or several.
    eventually(Duration::from_secs(30), || async {
        for &id in &tasks {
            if store.get(id).await.unwrap().is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(db.count("tasks").await, 0);
    assert_eq!(db.count("attempts").await, 0);
    // The app's rows stay; the task itself is now unknown.
    assert_eq!(db.count("replies").await, 3);
    let gone = api.task(ALICE, &tasks[0].to_string(), None).await;
    assert_eq!(gone.status, 404);
    // The key is free again: the same press is new work.
    let again = api.send(ALICE, "conv-1", Some("send-0"), "Hello?").await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed(), "a purged key is not replayed");

    // The sweep stops with the service (shutdown waits for it).
    tokio::time::timeout(Duration::from_secs(30), service.stop())
        .await
        .expect("the service, sweep included, stops");
}
