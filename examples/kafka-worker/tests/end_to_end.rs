//! End to end against a real Kafka-protocol broker (tansu): 200 tasks, some
//! handed off twice, two consumers in one group, one killed mid-run without
//! committing. Every commit is journaled and checked.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_worker::sim::{self as journal, MemoryJournal, Script, SimulatedLlm};
use kafka_worker::work_with;
use taskfence::runtime::ConsumerConfig;
use taskfence::testing::PgFixture;
use taskfence::{MemoryStore, RetryPolicy, Status, TaskId, TaskStore};
use taskfence_kafka::journal::{Event, Handled};
use taskfence_kafka::{Dispatcher, Handoffs, KafkaConfig, PgPositions, ReplyConsumer, ensure_topic};

use support::{GroupProbe, KafkaBroker, topic_and_group, wait_until};
use taskfence::testing::task_in;

const TASKS: usize = 200;
const PARTITIONS: i32 = 4;
const MAX_ATTEMPTS: u32 = 4;

fn payload(i: usize) -> String {
    match i {
        i if i % 50 == 7 => format!("down:message {i}"),
        i if i % 50 == 17 => format!("refuse:message {i}"),
        i if i % 10 == 3 => format!("flaky:message {i}"),
        i => format!("message {i}"),
    }
}

fn worker_config(name: &str) -> ConsumerConfig {
    ConsumerConfig::new(name, Duration::from_secs(3))
        .concurrency(16)
        .renew_every(Duration::from_secs(1))
        .min_retry_delay(Duration::from_millis(100))
}

/// Where the consumers keep their positions.
enum Mode {
    /// The consumer group's committed offsets; tasks in a `MemoryStore`.
    GroupOffsets,
    /// PostgreSQL, saved with each completion; tasks in a `PgStore`.
    Postgres(PgFixture),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_offsets_two_consumers_one_killed_every_task_settles_once() {
    scenario(Mode::GroupOffsets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_positions_two_consumers_one_killed_every_task_settles_once() {
    scenario(Mode::Postgres(taskfence_test_support::fixture().await)).await;
}

async fn scenario(mode: Mode) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let started = Instant::now();
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    let (topic, group) = topic_and_group();
    ensure_topic(bootstrap, &topic, PARTITIONS).await.expect("topic");

    let journal = Arc::new(MemoryJournal::new());
    let (store, pg): (Arc<dyn TaskStore>, _) = match &mode {
        Mode::GroupOffsets => (Arc::new(MemoryStore::new()), None),
        Mode::Postgres(fixture) => {
            let pg = Arc::new(fixture.pg_store().clone());
            let positions = Arc::new(PgPositions::new(&pg, &group).await.expect("positions table"));
            (pg.clone() as Arc<dyn TaskStore>, Some((pg, positions)))
        }
    };
    let provider = Arc::new(SimulatedLlm::new(
        Duration::from_millis(50),
        Duration::from_millis(300),
    ));

    // Submit the work (the chat API's side).
    let policy = RetryPolicy::default()
        .max_attempts(MAX_ATTEMPTS)
        .initial_backoff(Duration::from_millis(200))
        .max_backoff(Duration::from_secs(1))
        .jitter(0.5);
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let task = task_in("user-1", &format!("req-{i}"))
            .payload(payload(i))
            .policy(policy);
        tasks.push(store.submit(task).await.expect("submit").into_task());
    }

    // Two consumers in one group; wait (bounded) until both own partitions.
    let config = |name: &str| KafkaConfig::new(bootstrap, &group, &topic, name);
    let spawn = |name: &str| match &pg {
        None => ReplyConsumer::spawn(
            config(name),
            Arc::clone(&store),
            worker_config(name),
            journal.clone(),
            work_with(provider.clone(), journal.clone(), name),
        )
        .expect("consumer"),
        Some((pg, positions)) => ReplyConsumer::spawn_with_positions(
            config(name),
            worker_config(name),
            Arc::clone(pg),
            Arc::clone(positions),
            journal.clone(),
            work_with(provider.clone(), journal.clone(), name),
        )
        .expect("consumer"),
    };
    let a = spawn("a");
    let b = spawn("b");
    let first_join = wait_until("a first assignment", Duration::from_secs(120), || async {
        !a.assigned().is_empty() || !b.assigned().is_empty()
    })
    .await;
    let both_joined = wait_until(
        "both consumers to own partitions",
        Duration::from_secs(120),
        || async {
            let (pa, pb) = (a.assigned(), b.assigned());
            !pa.is_empty() && !pb.is_empty() && pa.len() + pb.len() == PARTITIONS as usize
        },
    )
    .await
        + first_join;

    // Hand off every task (from PostgreSQL's outbox in that mode); every seventh one twice.
    // One record per produce batch: tansu 0.6.0 mishandles multi-record batches.
    let handoffs = Arc::new(
        Handoffs::with_records_per_batch(bootstrap, &topic, journal.clone(), Some(1)).expect("producer"),
    );
    let mut duplicates = 0;
    if let Some((pg, _)) = &pg {
        let dispatcher = Dispatcher::new((**pg).clone(), Arc::clone(&handoffs), TASKS);
        let published = dispatcher.round().await.expect("dispatch");
        // A failed publish would end the round early: all of them means none failed.
        assert_eq!(published.len(), TASKS, "one pending handoff per submitted task");
    }
    for (i, task) in tasks.iter().enumerate() {
        if pg.is_none() {
            handoffs
                .publish(taskfence::wire::Stamp::from(task))
                .await
                .expect("publish");
        }
        if i % 7 == 0 {
            handoffs
                .publish(taskfence::wire::Stamp::from(task))
                .await
                .expect("publish again");
            duplicates += 1;
        }
    }

    // Kill b mid-run: after it has called the provider a few times and committed.
    let b_calls =
        |j: &MemoryJournal| j.count(|e| matches!(e, Event::ProviderCall { worker, .. } if worker == "b"));
    let b_commits =
        |j: &MemoryJournal| j.count(|e| matches!(e, Event::Commit { consumer, .. } if consumer == "b"));
    wait_until("b to work and commit", Duration::from_secs(60), || async {
        b_calls(&journal) >= 20 && b_commits(&journal) >= 2
    })
    .await;
    let b_partitions = b.assigned();
    let kill_at = Instant::now();
    b.kill();
    let events_at_kill = journal.events().len();

    // The survivor takes over; wait until every task is settled and the group's
    // committed offsets reached the end of every partition.
    let takeover = wait_until("a to own every partition", Duration::from_secs(120), || async {
        a.assigned().len() == PARTITIONS as usize
    })
    .await;
    let probe = GroupProbe::new(bootstrap, &group, &topic, PARTITIONS);
    let all_partitions: Vec<i32> = (0..PARTITIONS).collect();
    let drained = wait_until(
        "every task settled and committed",
        Duration::from_secs(180),
        || async {
            for t in &tasks {
                if !store
                    .get(t.id)
                    .await
                    .expect("get")
                    .is_some_and(|t| t.status.is_terminal())
                {
                    return false;
                }
            }
            let ends = probe.positions();
            match &pg {
                None => ends.iter().all(|(committed, end)| *committed == Some(*end)),
                Some((_, positions)) => {
                    let saved = positions
                        .load(&topic, &all_partitions)
                        .await
                        .expect("load positions");
                    ends.iter()
                        .enumerate()
                        .all(|(p, (_, end))| saved.get(&(p as i32)) == Some(end))
                }
            }
        },
    )
    .await;
    a.shutdown().await;
    let events = journal.events();

    // 1. Every task ended with exactly one saved response, or a terminal failure within budget.
    let mut completed_by: HashMap<TaskId, usize> = HashMap::new();
    for e in &events {
        if let Event::Finished {
            task: Some(t),
            handled: Handled::Completed,
            ..
        } = e
        {
            *completed_by.entry(*t).or_default() += 1;
        }
    }
    let (mut completed, mut failed) = (0, 0);
    for (i, submitted) in tasks.iter().enumerate() {
        let task = store.get(submitted.id).await.unwrap().unwrap();
        assert!(
            task.attempts() <= MAX_ATTEMPTS,
            "task {i} used {} attempts",
            task.attempts()
        );
        match Script::of(payload(i).as_bytes()) {
            Script::Reply | Script::Flaky | Script::Slow => {
                assert_eq!(task.status, Status::Completed, "task {i}");
                let text = task
                    .response
                    .as_ref()
                    .and_then(|r| r.as_str())
                    .expect("a text response");
                assert!(
                    text.starts_with(&format!("reply to {}", payload(i))),
                    "task {i}: {text}"
                );
                assert_eq!(
                    completed_by.get(&task.id),
                    Some(&1),
                    "task {i}: one accepted save"
                );
                completed += 1;
            }
            Script::Down => {
                assert_eq!(task.status, Status::Failed, "task {i}");
                assert_eq!(
                    task.attempts(),
                    MAX_ATTEMPTS,
                    "task {i}: the whole budget, no more"
                );
                failed += 1;
            }
            Script::Hang => unreachable!("this scenario has no hanging prompts"),
            Script::Refuse => {
                assert_eq!(task.status, Status::Failed, "task {i}");
                assert!(task.response.is_none());
                failed += 1;
            }
        }
    }
    assert_eq!(completed + failed, TASKS);

    // 2. The journal's checks: no commit past an unfinished record, every
    //    assignment resumed from the committed offset, no provider call after completion.
    let checked = journal::check(&events).unwrap_or_else(|v| panic!("violations: {v:#?}"));
    assert!(checked.commits_by.get("a").is_some_and(|n| *n > 0), "{checked:?}");
    assert!(checked.commits_by.get("b").is_some_and(|n| *n > 0), "{checked:?}");

    // 3. b was killed without committing anything afterwards.
    let killed_at = events
        .iter()
        .position(|e| matches!(e, Event::Killed { consumer } if consumer == "b"))
        .expect("kill journaled");
    assert!(
        !events[killed_at..]
            .iter()
            .any(|e| matches!(e, Event::Commit { consumer, .. } if consumer == "b")),
        "a killed consumer commits nothing"
    );

    // 4. The group resumed b's partitions from b's last commit: a's first record
    //    of each is the offset b committed (the check above compares it exactly).
    let mut resumed_from_b = 0;
    for p in &b_partitions {
        let b_committed: HashSet<i64> = events[..killed_at]
            .iter()
            .filter_map(|e| match e {
                Event::Commit {
                    consumer,
                    partition,
                    offset,
                    ..
                } if consumer == "b" && partition == p => Some(*offset),
                _ => None,
            })
            .collect();
        let assigned = events[killed_at..].iter().find_map(|e| match e {
            Event::Assigned {
                consumer,
                partition,
                committed,
            } if consumer == "a" && partition == p => Some(*committed),
            _ => None,
        });
        let first = events[killed_at..].iter().find_map(|e| match e {
            Event::Received {
                consumer,
                partition,
                offset,
                ..
            } if consumer == "a" && partition == p => Some(*offset),
            _ => None,
        });
        eprintln!(
            "partition {p}: b committed {b_committed:?}; a assigned at {assigned:?}, first read {first:?}"
        );
        if let Some(Some(c)) = assigned {
            assert_eq!(first, Some(c), "partition {p}: a resumed at the committed offset");
            resumed_from_b += usize::from(b_committed.contains(&c));
        }
    }
    assert!(
        resumed_from_b > 0,
        "a resumed at least one of b's partitions from b's commit"
    );

    // 5. Re-read records of completed tasks never reached the provider: each
    //    provider call is a distinct attempt the store counted, and the check
    //    found no call after completion. There were re-reads to skip.
    let mut calls = HashSet::new();
    for e in &events {
        if let Event::ProviderCall { task, version, .. } = e {
            assert!(calls.insert((*task, *version)), "one provider call per attempt");
            let t = store.get(*task).await.unwrap().unwrap();
            assert!(*version <= t.version, "a call without a counted attempt");
        }
    }
    assert!(
        checked.rereads > 0,
        "duplicates and re-reads after the kill were exercised"
    );
    let abandoned_by_b = events[events_at_kill.min(killed_at)..]
        .iter()
        .filter(|e| matches!(e, Event::Received { consumer, .. } if consumer == "a"))
        .count();

    let saved_with_completion = events
        .iter()
        .filter(|e| matches!(e, Event::Commit { with: Some(_), .. }))
        .count();
    if pg.is_some() {
        assert!(
            saved_with_completion > 0,
            "positions were saved in the completion's transaction"
        );
    } else {
        assert_eq!(saved_with_completion, 0);
    }
    eprintln!(
        "figures ({}): {saved_with_completion} positions saved with a completion; {TASKS} tasks + {duplicates} duplicate handoffs; {completed} completed, {failed} failed; \
         {} provider calls; {} commits checked (a {}, b {}); {} resumptions checked ({} from a commit); \
         {} re-reads skipped; {abandoned_by_b} records read by a after the kill; \
         first join {first_join:.1?}, both joined {both_joined:.1?}, takeover after kill {takeover:.1?}, \
         drained {drained:.1?} after takeover, total {:.1?} (kill at {:.1?})",
        if pg.is_some() {
            "postgres positions"
        } else {
            "group offsets"
        },
        checked.provider_calls,
        checked.commits,
        checked.commits_by.get("a").unwrap_or(&0),
        checked.commits_by.get("b").unwrap_or(&0),
        checked.resumptions,
        checked.resumed_from_commit,
        checked.rereads,
        started.elapsed(),
        kill_at - started,
    );
}
