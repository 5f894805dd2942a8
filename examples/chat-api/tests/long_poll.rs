//! `GET /tasks/{id}?wait=`: a reconnecting browser waits for the saved reply
//! and gets it as soon as it is committed, from a worker in another "process".

mod support;

use std::time::{Duration, Instant};

use chat_api::Mode;
use support::{ALICE, TestDb, TestService, ids};
use taskfence_test_support::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_the_reply_as_soon_as_a_separate_worker_saves_it() {
    let db = TestDb::new().await;
    // `--no-worker`: nothing can answer until a worker starts below.
    let api_service = TestService::start(&db, Mode::ApiOnly).await;
    let api = api_service.api().clone();
    let (task_id, _) = ids(&api.send(ALICE, "conv-1", Some("send-1"), "Are you there?").await);

    // With no worker, the wait ends and the task is still pending.
    let ended = api.task(ALICE, &task_id, Some("300ms")).await;
    assert_eq!(ended.status, 200);
    let ended = ended.json();
    assert_eq!(ended["status"], "pending");
    assert!(ended["reply"].is_null());
    assert_eq!(ended["attempts"], 0);

    let waiting = tokio::spawn({
        let (api, task_id) = (api.clone(), task_id.clone());
        async move { api.task(ALICE, &task_id, Some("30s")).await }
    });
    // The request has reached its wait once it subscribed to reply events.
    eventually(Duration::from_secs(10), || async {
        (api_service.service().long_polls() == 1).then_some(())
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "no worker runs, so the long-poll cannot have an answer yet"
    );

    // `--worker-only`: another service on the same database saves the reply.
    let worker_started = Instant::now();
    let worker = TestService::start(&db, Mode::WorkerOnly).await;
    let answered = tokio::time::timeout(Duration::from_secs(29), waiting)
        .await
        .expect("the long-poll returned before its 30 s wait ended")
        .expect("the request task");
    assert!(worker_started.elapsed() < Duration::from_secs(30));
    assert_eq!(answered.status, 200);
    let view = answered.json();
    assert_eq!(view["status"], "completed");
    assert_eq!(view["reply"]["content"], "Reply to: Are you there? (attempt 1)");
    assert_eq!(view["attempts"], 1);

    // Reconnecting later: the same saved reply, never a second one.
    let later = api.task(ALICE, &task_id, Some("5s")).await.json();
    assert_eq!(later, view);
    assert_eq!(db.count("replies").await, 1);

    worker.stop().await;
    api_service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_long_polls_on_different_tasks_each_get_their_own_reply() {
    let db = TestDb::new().await;
    let service = TestService::start(&db, Mode::Both).await;
    let api = service.api().clone();

    let mut polls = tokio::task::JoinSet::new();
    for i in 0..5 {
        let api = api.clone();
        polls.spawn(async move {
            let prompt = format!("question {i}");
            let (task_id, _) = ids(&api
                .send(ALICE, "conv-1", Some(&format!("send-{i}")), &prompt)
                .await);
            (prompt, api.task(ALICE, &task_id, Some("30s")).await.json())
        });
    }
    for (prompt, view) in polls.join_all().await {
        assert_eq!(view["status"], "completed", "{view}");
        assert_eq!(
            view["reply"]["content"],
            format!("Reply to: {prompt} (attempt 1)")
        );
    }
    service.stop().await;
    assert_eq!(db.count("replies").await, 5);
}
