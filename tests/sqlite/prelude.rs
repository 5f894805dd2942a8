//! `taskfence::prelude` is enough for a SQLite service: the store and its
//! builder, a consumer on the store as the queue, and the answers.

use std::sync::Arc;
use std::time::Duration;

use taskfence::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prelude_names_the_store_and_its_builder_and_a_consumer_drains_it() {
    let dir = std::env::temp_dir().join(format!("taskfence-prelude-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let builder: SqliteStoreBuilder =
        SqliteStore::builder(dir.join("tasks.db")).busy_budget(Duration::from_secs(5));
    let store: SqliteStore = builder.open().await.unwrap();
    store.migrate().await.unwrap();

    let store: Arc<dyn TaskStore> = Arc::new(store);
    let queue = StoreQueue::new(store.clone());
    let mut ids = Vec::new();
    for n in 0..5 {
        let key = RequestKey::new("u", "chat.reply", format!("k{n}"));
        let new = NewTask::new(key, InputHash::of([n.to_string()])).without_handoff();
        ids.push(store.submit(new).await.unwrap().into_task().id);
    }
    let consumer = queue
        .consumer(ConsumerConfig::new("w", Duration::from_secs(30)).concurrency(2))
        .unwrap();
    let stop = consumer.stop().clone();
    let running =
        tokio::spawn(consumer.run(|ctx| async move { Ok(Response::from(ctx.task().key.key.clone())) }));
    for id in &ids {
        while store.get(*id).await.unwrap().map(|t| t.status) != Some(Status::Completed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    stop.request();
    assert_eq!(running.await.unwrap().unwrap().completed, 5);
    let first = store.get(ids[0]).await.unwrap().unwrap();
    assert_eq!(
        first.response,
        Some(Response::from("k0")),
        "each saved its own response"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
