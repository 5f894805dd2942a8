//! Several `kafka-worker` processes starting at once on a fresh schema, in
//! the PostgreSQL position mode: every one of them stays up (start-up DDL is
//! serialized, not raced), and the work is done once.
//!
//! The race this guards against is probabilistic (a `CREATE TABLE IF NOT
//! EXISTS` run by two processes at the same instant), so the simultaneous
//! start is repeated on [`ROUNDS`] fresh schemas, each with a topic and group
//! of its own.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use taskfence::store::AttemptOutcome;
use taskfence::{Status, TaskStore};
use taskfence_kafka::dispatcher::task_id;
use taskfence_test_support::process::ChildProcess;

use support::{ServiceRun, read_topic};

const PARTITIONS: i32 = 3;
const WORKERS: usize = 3;
const TASKS: usize = 12;
/// Fresh schemas the three processes start together on, one after another.
const ROUNDS: usize = 12;
/// The first join of a group on tansu can take ~20 s; the rebalances of three
/// members joining one after another add to it.
const WITHIN: Duration = Duration::from_secs(120);

#[rustfmt::skip]
const SERVICE_ARGS: [&str; 12] = [
    "--positions", "postgres", "--session-timeout", "10s", "--retry-delay", "200ms",
    "--sim-min-latency", "20ms", "--sim-max-latency", "100ms", "--shutdown-grace", "5s",
];

struct Worker {
    name: String,
    process: ChildProcess,
    log: PathBuf,
}

impl Worker {
    /// Panics, with the worker's log, if it has exited.
    fn assert_running(&mut self, round: usize, when: &str) {
        if let Some(status) = self.process.try_exit() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!(
                "round {round}: {} exited ({status}) {when}; every worker must stay up. Log {}:\n{log}",
                self.name,
                self.log.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_starting_together_on_a_fresh_schema_all_stay_up_and_work_once() {
    for round in 1..=ROUNDS {
        one_round(round).await;
    }
}

async fn one_round(round: usize) {
    let run = ServiceRun::start(PARTITIONS, (0..TASKS).map(|i| format!("message {i}"))).await;
    let pg = run.pg();
    let positions_table = format!("{}.kafka_consumer_positions", pg.schema());
    let exists = |table: String| async move {
        sqlx::query_scalar::<_, Option<String>>("SELECT to_regclass($1)::text")
            .bind(table)
            .fetch_one(pg.pool())
            .await
            .expect("to_regclass")
            .is_some()
    };
    assert!(
        !exists(positions_table.clone()).await,
        "round {round}: the schema is fresh, no positions table yet"
    );

    // All three started back to back, before any of them is past its start-up.
    let started = Instant::now();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|w| {
            let name = format!("worker-{round}-{w}");
            let (process, log) = run.service(&name, &SERVICE_ARGS, &[]);
            Worker { name, process, log }
        })
        .collect();
    let spawned_in = started.elapsed();

    // Until every task is completed, no worker may exit.
    let deadline = Instant::now() + WITHIN;
    loop {
        for worker in &mut workers {
            worker.assert_running(round, "while the tasks were worked on");
        }
        let mut done = true;
        for task in &run.tasks {
            if pg.get(task.id).await.expect("get").expect("task").status != Status::Completed {
                done = false;
                break;
            }
        }
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "round {round}: not every task completed within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let completed_in = started.elapsed();
    // Well past start-up: still all up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for worker in &mut workers {
        worker.assert_running(round, "after the work was done");
    }
    assert!(
        exists(positions_table).await,
        "round {round}: the positions table was created"
    );

    // Once: one saved response and one attempt per task, one handoff each.
    for task in &run.tasks {
        let saved = pg.get(task.id).await.unwrap().unwrap();
        let attempts = pg.attempts(task.id).await.unwrap();
        assert_eq!(saved.status, Status::Completed);
        assert!(saved.response.is_some(), "{}: a saved response", task.id);
        assert_eq!(
            attempts.len(),
            1,
            "round {round}, {}: worked on once: {attempts:?}",
            task.id
        );
        assert_eq!(attempts[0].outcome, AttemptOutcome::Completed);
    }
    let mut handoffs: HashMap<_, usize> = HashMap::new();
    for (_, _, payload) in read_topic(run.broker.bootstrap(), &run.topic, PARTITIONS) {
        let id = task_id(payload.as_deref()).expect("a handoff names its task");
        *handoffs.entry(id).or_default() += 1;
    }
    for task in &run.tasks {
        assert_eq!(
            handoffs.get(&task.id),
            Some(&1),
            "round {round}, {}: published once (no batch of a failed start-up published again)",
            task.id
        );
    }
    assert_eq!(handoffs.len(), TASKS, "no handoff of another task");

    // Every worker stops cleanly.
    for worker in &workers {
        worker.process.signal("TERM");
    }
    for worker in &mut workers {
        let status = worker
            .process
            .wait_exit(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("round {round}: {} did not exit on SIGTERM", worker.name));
        assert!(
            status.success(),
            "round {round}: {} exit status {status}",
            worker.name
        );
    }
    eprintln!(
        "figures (start-up, round {round}): {WORKERS} workers spawned in {spawned_in:.1?}, all up; \
         {TASKS} tasks completed once {completed_in:.1?} after the start"
    );
}
