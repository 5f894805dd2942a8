//! Batches against a real Kafka-protocol broker (tansu) and PostgreSQL: the
//! dispatcher publishes the outbox in batches (`PgStore::dispatch_batches`),
//! and the consumer claims the records of a poll together (`claim_many`).
//! Every claim goes through a counting `Intercepted` store, so the test sees
//! how many claim round trips there were; the journal proves one saved
//! response per task and that no commit passed an unfinished record.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kafka_worker::sim::{self as journal, MemoryJournal, SimulatedLlm};
use kafka_worker::work_with;
use taskfence::intercept::{Intercept, Intercepted};
use taskfence::runtime::ConsumerConfig;
use taskfence::{Claim, ClaimRequest, Result, Status, TaskId, TaskStore};
use taskfence_kafka::journal::{Event, Handled, Journal};
use taskfence_kafka::{Dispatcher, Handoffs, KafkaConfig, ReplyConsumer, ensure_topic};

use support::{GroupProbe, KafkaBroker, topic_and_group, wait_until};
use taskfence::testing::task_in;

const TASKS: usize = 60;
const PARTITIONS: i32 = 2;

/// Counts the claim round trips: single claims, and batch claims with their sizes.
#[derive(Debug, Default)]
struct CountClaims {
    claims: AtomicUsize,
    batches: AtomicUsize,
    batched: AtomicUsize,
    largest: AtomicUsize,
}

/// `(claims, batches, tasks in batches, largest batch)` so far.
type Counts = (usize, usize, usize, usize);

impl CountClaims {
    fn counts(&self) -> Counts {
        (
            self.claims.load(Ordering::SeqCst),
            self.batches.load(Ordering::SeqCst),
            self.batched.load(Ordering::SeqCst),
            self.largest.load(Ordering::SeqCst),
        )
    }
}

#[async_trait]
impl Intercept for CountClaims {
    async fn claim(&self, inner: &dyn TaskStore, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        inner.claim(id, request).await
    }

    async fn claim_many(
        &self,
        inner: &dyn TaskStore,
        ids: &[TaskId],
        request: ClaimRequest,
    ) -> Result<Vec<Claim>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.batched.fetch_add(ids.len(), Ordering::SeqCst);
        self.largest.fetch_max(ids.len(), Ordering::SeqCst);
        // PgStore's own batch: one statement.
        inner.claim_many(ids, request).await
    }
}

fn config(bootstrap: &str, group: &str, topic: &str, name: &str) -> KafkaConfig {
    KafkaConfig::new(bootstrap, group, topic, name)
}

fn worker_config(name: &str) -> ConsumerConfig {
    ConsumerConfig::new(name, Duration::from_secs(3))
        // Room for every record: a batch is what one poll fetched.
        .concurrency(64)
        .renew_every(Duration::from_secs(1))
        .min_retry_delay(Duration::from_millis(100))
}

/// Waits until every partition's committed offset is its end: every record handled.
async fn wait_committed(probe: &GroupProbe, what: &str) -> Duration {
    wait_until(what, Duration::from_secs(120), || async {
        probe
            .positions()
            .iter()
            .all(|(committed, end)| *committed == Some(*end))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poll_is_claimed_in_batches_and_every_task_is_saved_once() {
    let started = Instant::now();
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    let fixture = taskfence_test_support::fixture().await;
    let pg = fixture.pg_store().clone();
    let (topic, group) = topic_and_group();
    ensure_topic(bootstrap, &topic, PARTITIONS).await.expect("topic");

    let counter = Arc::new(Intercepted::new(Arc::new(pg.clone()), CountClaims::default()));
    let store: Arc<dyn TaskStore> = counter.clone();
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let submitted = pg
            .submit(task_in("user-1", &format!("req-{i}")).payload(format!("message {i}")))
            .await;
        tasks.push(submitted.expect("submit").into_task());
    }

    // The outbox, published 25 per call: three calls for the 60 handoffs.
    // Then every tenth task handed off a second time.
    let journal = Arc::new(MemoryJournal::new());
    // One record per produce batch: tansu 0.6.0 mishandles multi-record batches.
    let handoffs = Arc::new(
        Handoffs::with_records_per_batch(bootstrap, &topic, journal.clone(), Some(1)).expect("producer"),
    );
    let dispatcher = Dispatcher::new(pg.clone(), Arc::clone(&handoffs), 1000).publish_batch(25);
    let published = dispatcher.round().await.expect("dispatch");
    assert_eq!(published.len(), TASKS, "every handoff published in one round");
    assert!(
        dispatcher.round().await.expect("dispatch").is_empty(),
        "and marked published: nothing left pending"
    );
    let mut duplicates = 0;
    for task in tasks.iter().step_by(10) {
        handoffs
            .publish(taskfence::wire::Stamp::from(task))
            .await
            .expect("publish again");
        duplicates += 1;
    }
    let records = TASKS + duplicates;
    let produced = journal.count(|e| matches!(e, Event::Produced { .. }));
    assert_eq!(produced, records, "one delivery report journaled per record");

    // 1. Fresh work: one consumer reads every record (already in the topic).
    let provider = Arc::new(SimulatedLlm::new(
        Duration::from_millis(50),
        Duration::from_millis(200),
    ));
    let a = ReplyConsumer::spawn(
        config(bootstrap, &group, &topic, "a"),
        Arc::clone(&store),
        worker_config("a"),
        journal.clone(),
        work_with(provider.clone(), journal.clone(), "a"),
    )
    .expect("consumer");
    let probe = GroupProbe::new(bootstrap, &group, &topic, PARTITIONS);
    let work = wait_committed(&probe, "every record handled and committed").await;
    a.shutdown().await;
    let fresh = counter.interceptor().counts();
    let events = journal.events();

    let checked = journal::check(&events).unwrap_or_else(|v| panic!("violations: {v:#?}"));
    let received = journal.count(|e| matches!(e, Event::Received { .. }));
    assert_eq!(received, records, "each record read once");
    let mut completed_by: HashMap<TaskId, usize> = HashMap::new();
    let mut finished = 0;
    for e in &events {
        if let Event::Finished { task, handled, .. } = e {
            finished += 1;
            let task = task.expect("every record names a task");
            match handled {
                Handled::Completed => *completed_by.entry(task).or_default() += 1,
                Handled::AlreadyCompleted | Handled::CompletedElsewhere => {}
                other => panic!("record of {task} handled as {other:?}"),
            }
        }
    }
    assert_eq!(finished, records, "every record finished");
    for (i, submitted) in tasks.iter().enumerate() {
        let task = store.get(submitted.id).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Completed, "task {i}");
        assert_eq!(task.attempts(), 1, "task {i}: one attempt");
        let text = task
            .response
            .as_ref()
            .and_then(|r| r.as_str())
            .expect("a response");
        assert!(
            text.starts_with(&format!("reply to message {i} ")),
            "task {i}: {text}"
        );
        assert_eq!(
            completed_by.get(&submitted.id),
            Some(&1),
            "task {i}: one accepted save"
        );
    }
    assert_eq!(checked.provider_calls, TASKS, "one provider call per task");

    let (claims, batches, batched, largest) = fresh;
    assert!(
        batches >= 1 && largest >= 2,
        "records claimed together: {fresh:?}"
    );
    assert!(
        claims + batched >= records,
        "every record's first claim is a single claim or in a batch: {fresh:?}"
    );
    assert!(
        claims + batches < records,
        "fewer claim round trips than records: {fresh:?}"
    );

    // 2. Re-reads: a second group reads the whole topic again. Every task is
    //    complete, so every record is skipped without a provider call, and
    //    the records of a poll are settled by one batch claim.
    let (group2, reread_journal) = (format!("{group}-again"), Arc::new(MemoryJournal::new()));
    for e in events.iter().filter(|e| matches!(e, Event::Produced { .. })) {
        reread_journal.record(e.clone());
    }
    let r = ReplyConsumer::spawn(
        config(bootstrap, &group2, &topic, "r"),
        Arc::clone(&store),
        worker_config("r"),
        reread_journal.clone(),
        work_with(provider, reread_journal.clone(), "r"),
    )
    .expect("consumer");
    let probe2 = GroupProbe::new(bootstrap, &group2, &topic, PARTITIONS);
    let reread = wait_committed(&probe2, "every record re-read and committed").await;
    r.shutdown().await;
    let after = counter.interceptor().counts();
    let reread_events = reread_journal.events();
    let rechecked = journal::check(&reread_events).unwrap_or_else(|v| panic!("violations: {v:#?}"));
    assert_eq!(rechecked.provider_calls, 0, "re-reads never reach the provider");
    let skipped = reread_journal.count(|e| {
        matches!(
            e,
            Event::Finished {
                handled: Handled::AlreadyCompleted,
                ..
            }
        )
    });
    assert_eq!(
        skipped, records,
        "every re-read record skipped as already completed"
    );
    let (claims2, batches2, batched2) = (after.0 - claims, after.1 - batches, after.2 - batched);
    assert!(batches2 >= 1, "re-reads claimed together: {after:?}");
    assert!(
        claims2 + batched2 == records,
        "exactly one claim per re-read record, single or in a batch: {after:?} after {fresh:?}"
    );
    assert!(
        2 * (claims2 + batches2) <= records,
        "at most half as many round trips as records: {claims2} claims + {batches2} batches for {records} records"
    );
    for submitted in &tasks {
        let task = store.get(submitted.id).await.unwrap().unwrap();
        assert_eq!(task.attempts(), 1, "a re-read takes no attempt");
    }

    eprintln!(
        "figures: {records} records ({TASKS} tasks + {duplicates} duplicates), published in batches of 25; \
         fresh work: {batches} batch claims ({batched} tasks, largest {largest}) + {claims} single claims, \
         handled and committed in {work:.1?}; re-reads: {batches2} batch claims ({batched2} tasks) + {claims2} single claims, \
         in {reread:.1?}; {} commits checked; total {:.1?}",
        checked.commits + rechecked.commits,
        started.elapsed(),
    );
}
