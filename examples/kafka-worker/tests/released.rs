//! The journal's `Released` event says whether the store accepted the
//! release: a consumer stopped with no grace gives back the tasks it works
//! on; the store accepts the release of two and refuses the third, which an
//! operator cancelled while it ran.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kafka_worker::sim::{MemoryJournal, SimulatedLlm};
use kafka_worker::work_with;
use taskfence::runtime::ConsumerConfig;
use taskfence::testing::task_in;
use taskfence::{MemoryStore, Status, TaskStore};
use taskfence_kafka::journal::Event;
use taskfence_kafka::{Handoffs, KafkaConfig, ReplyConsumer, ensure_topic};

use support::{KafkaBroker, topic_and_group, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_events_say_whether_the_store_accepted_the_release() {
    let broker = KafkaBroker::start();
    let (topic, group) = topic_and_group();
    ensure_topic(broker.bootstrap(), &topic, 1).await.expect("topic");
    let store = Arc::new(MemoryStore::new());
    let journal = Arc::new(MemoryJournal::new());
    let mut tasks = Vec::new();
    for i in 0..3 {
        // `hang:`: the provider never answers, so each task is still worked on at the stop.
        let new = task_in("user-1", &format!("req-{i}")).payload(format!("hang:message {i}"));
        tasks.push(store.submit(new).await.expect("submit").into_task());
    }
    // A long lease (renewed after 20 s): nothing but the cancellation touches it.
    let config = ConsumerConfig::new("a", Duration::from_secs(60))
        .concurrency(3)
        .stop_after(Duration::ZERO, Duration::from_secs(5));
    let consumer = ReplyConsumer::spawn(
        KafkaConfig::new(broker.bootstrap(), &group, &topic, "a"),
        Arc::clone(&store) as Arc<dyn TaskStore>,
        config,
        journal.clone(),
        work_with(
            Arc::new(SimulatedLlm::new(Duration::ZERO, Duration::ZERO)),
            journal.clone(),
            "a",
        ),
    )
    .expect("consumer");
    let handoffs = Handoffs::with_records_per_batch(broker.bootstrap(), &topic, journal.clone(), Some(1))
        .expect("producer");
    for task in &tasks {
        handoffs
            .publish(taskfence::wire::Stamp::from(task))
            .await
            .expect("publish");
    }
    let calls = |j: &MemoryJournal| j.count(|e| matches!(e, Event::ProviderCall { .. }));
    wait_until(
        "the provider called for every task",
        Duration::from_secs(120),
        || async { calls(&journal) == tasks.len() },
    )
    .await;

    // The operator cancels one while it runs: its release will be refused.
    let cancelled = tasks[0].id;
    assert!(
        store
            .cancel(cancelled, "no longer wanted")
            .await
            .expect("cancel")
            .is_accepted()
    );
    let stopped = consumer.shutdown().await;
    assert_eq!(stopped.released, 3, "{stopped:?}");

    let mut released: Vec<_> = journal
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Released {
                task,
                accepted,
                refusal,
                ..
            } => Some((task, accepted, refusal)),
            _ => None,
        })
        .collect();
    released.sort_by_key(|(task, ..)| tasks.iter().position(|t| t.id == *task));
    assert_eq!(released.len(), 3, "{released:?}");
    let (task, accepted, refusal) = &released[0];
    assert_eq!((*task, *accepted), (cancelled, false));
    let refusal = refusal.as_deref().expect("the refusal");
    assert!(refusal.starts_with("refused: "), "{refusal}");
    assert!(refusal.contains("cancelled"), "{refusal}");
    for ((task, accepted, refusal), submitted) in released[1..].iter().zip(&tasks[1..]) {
        assert_eq!((*task, *accepted, refusal), (submitted.id, true, &None));
        let now = store.get(*task).await.unwrap().unwrap();
        assert_eq!(now.status, Status::Pending, "released: claimable again");
    }
    let now = store.get(cancelled).await.unwrap().unwrap();
    assert_eq!(
        now.status,
        Status::Cancelled,
        "the refused release changed nothing"
    );
}
