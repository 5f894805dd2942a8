//! Versions on the wire, against a real Kafka-protocol broker (tansu): the
//! dispatcher's handoff records carry the task id and assignment version in
//! their headers, the consumer publishes each saved result stamped with the
//! assignment that saved it, and a downstream consumer ([`Downstream`])
//! drops a result of assignment 2 that arrives after one of assignment 3.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kafka_worker::sim::{MemoryJournal, SimulatedLlm};
use kafka_worker::work_with;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use taskfence::runtime::ConsumerConfig;
use taskfence::wire::Stamp;
use taskfence::{Status, TaskId, TaskStore};
use taskfence_kafka::dispatcher::{stamp, stamp_headers};
use taskfence_kafka::{
    Dispatcher, Downstream, Handoffs, KafkaConfig, ReplyConsumer, Results, Verdict, ensure_topic,
};

use support::{KafkaBroker, topic_and_group, wait_until};
use taskfence::testing::task_in;

/// Reads partition 0 of `topic` from the start until `count` records came
/// (bounded: 60 s), without joining a group.
fn read(bootstrap: &str, topic: &str, count: usize) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{}", TaskId::new()))
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut partitions = TopicPartitionList::new();
    partitions
        .add_partition_offset(topic, 0, Offset::Beginning)
        .expect("partition");
    consumer.assign(&partitions).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut records = Vec::new();
    while records.len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {count} records of {topic} within 60 s",
            records.len()
        );
        if let Some(record) = consumer.poll(Duration::from_millis(200)) {
            records.push(record.expect("record").detach());
        }
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handoffs_and_results_carry_the_task_id_and_version_and_stale_results_are_dropped() {
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    let fixture = taskfence_test_support::fixture().await;
    let pg = fixture.pg_store().clone();
    let (topic, group) = topic_and_group();
    let results_topic = format!("results-{group}");
    ensure_topic(bootstrap, &topic, 1).await.expect("topic");
    ensure_topic(bootstrap, &results_topic, 1)
        .await
        .expect("results topic");

    // The dispatcher publishes the outbox: one handoff, stamped with the
    // task's id and version 0 (never claimed).
    let task = pg
        .submit(task_in("user-1", "req-0").payload("message 0"))
        .await
        .expect("submit")
        .into_task();
    let journal = Arc::new(MemoryJournal::new());
    let handoffs = Arc::new(
        Handoffs::with_records_per_batch(bootstrap, &topic, journal.clone(), Some(1)).expect("producer"),
    );
    let published = Dispatcher::new(pg.clone(), handoffs, 10)
        .round()
        .await
        .expect("dispatch");
    assert_eq!(published, [task.id]);
    let handoff = read(bootstrap, &topic, 1);
    assert_eq!(stamp(&handoff[0]), Ok(Stamp::new(task.id, 0)));
    assert_eq!(handoff[0].payload(), Some(task.id.to_string().as_bytes()));

    // The consumer claims it (assignment 1), saves the answer, then
    // publishes the saved result stamped with assignment 1.
    let results = Arc::new(Results::new(bootstrap, &results_topic, Some(1)).expect("results producer"));
    let kafka = KafkaConfig::new(bootstrap, &group, &topic, "a").publish_results(results);
    let provider = Arc::new(SimulatedLlm::new(
        Duration::from_millis(10),
        Duration::from_millis(50),
    ));
    let config = ConsumerConfig::new("a", Duration::from_secs(5)).min_retry_delay(Duration::from_millis(100));
    let consumer = ReplyConsumer::spawn(
        kafka,
        Arc::new(pg.clone()),
        config,
        journal.clone(),
        work_with(provider, journal, "a"),
    )
    .expect("consumer");
    wait_until("the task to be completed", Duration::from_secs(120), || async {
        pg.get(task.id)
            .await
            .expect("get")
            .is_some_and(|t| t.status == Status::Completed)
    })
    .await;
    let result = read(bootstrap, &results_topic, 1);
    consumer.shutdown().await;
    let saved = pg.get(task.id).await.expect("get").expect("task");
    assert_eq!(saved.version, 1);
    assert_eq!(
        stamp(&result[0]),
        Ok(Stamp::from(&saved)),
        "the assignment that saved it"
    );
    assert_eq!(result[0].key(), Some(task.id.to_string().as_bytes()));
    assert_eq!(
        result[0].payload(),
        saved.response.as_ref().map(|r| r.as_bytes()),
        "the saved response"
    );

    // Downstream: results of assignments 3, then 2 (a late copy), then 3
    // again (a duplicate delivery) and another task's, as the broker delivers them.
    let other = TaskId::new();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("batch.num.messages", "1")
        .create()
        .expect("producer");
    let order = [
        Stamp::new(task.id, 3),
        Stamp::new(task.id, 2),
        Stamp::new(task.id, 3),
        Stamp::new(other, 1),
    ];
    for stamp in order {
        let key = stamp.task_id.to_string();
        let record = FutureRecord::to(&results_topic)
            .key(&key)
            .payload(&[][..])
            .headers(stamp_headers(&stamp));
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(error, _)| error)
            .expect("produce");
    }
    let records = read(bootstrap, &results_topic, 1 + order.len());
    let mut downstream = Downstream::new(1_000);
    let verdicts: Vec<Verdict> = records.iter().map(|r| downstream.judge(r)).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Keep(Stamp::new(task.id, 1)),
            Verdict::Keep(Stamp::new(task.id, 3)),
            Verdict::Stale(Stamp::new(task.id, 2)),
            Verdict::Keep(Stamp::new(task.id, 3)),
            Verdict::Keep(Stamp::new(other, 1)),
        ]
    );
}
