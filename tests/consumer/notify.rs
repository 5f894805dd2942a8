//! `StoreQueue::wake_on_notify` (PostgreSQL only): a task submitted by
//! another process — here another store on the same schema, which wakes
//! nothing in this process — starts at once instead of at the next poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taskfence::runtime::{ConsumerConfig, StoreQueue};
use taskfence::{InputHash, NewTask, PgStore, RequestKey, Response, TaskStore};

/// Longer than the test waits for a start: only a wake-up can start work in time.
const POLL: Duration = Duration::from_secs(30);

fn queued(key: &str) -> NewTask {
    NewTask::new(
        RequestKey::new("tenant-1", "chat.reply", key),
        InputHash::of([key]),
    )
    .without_handoff()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notified_submission_from_another_process_wakes_an_idle_consumer() {
    let f = crate::common::fixture().await;
    let notifying = |pool: sqlx::PgPool| {
        PgStore::builder(pool)
            .schema(f.schema())
            .notify_on_submit()
            .build()
            .unwrap()
    };
    let ours = notifying(f.pg_store().pool().clone());
    // The other process: its own store on the same schema.
    let theirs = notifying(f.pg_store().pool().clone());

    let queue = StoreQueue::new(Arc::new(ours.clone())).operation("chat.reply");
    let started = Arc::new(AtomicUsize::new(0));
    let consumer = queue
        .clone()
        .consumer(ConsumerConfig::new("consumer-1", Duration::from_secs(30)).idle(POLL, POLL))
        .unwrap();
    let stop = consumer.stop().clone();
    let seen = Arc::clone(&started);
    let running = tokio::spawn(consumer.run(move |_ctx| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok(Response::from("started")) }
    }));
    // The consumer's first fetch found nothing: it now waits out its poll.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Without a listener, another process's task waits for the poll.
    theirs.submit(queued("before-listening")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(started.load(Ordering::SeqCst), 0, "no wake-up without a listener");

    // The listener wakes it once on start (what was submitted before) and on each notification.
    let listening = queue.wake_on_notify(&ours);
    let within = Duration::from_secs(10);
    crate::common::eventually(within, || async {
        (started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    theirs.submit(queued("after-listening")).await.unwrap();
    crate::common::eventually(within, || async {
        (started.load(Ordering::SeqCst) == 2).then_some(())
    })
    .await;

    listening.abort();
    stop.request();
    assert_eq!(running.await.unwrap().unwrap().completed, 2);
}
