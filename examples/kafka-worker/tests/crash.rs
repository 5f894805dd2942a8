//! The worker service killed with SIGKILL while it holds tasks: nothing is
//! lost. A second service in the same group re-reads from the committed
//! offset, takes the tasks over once their leases expire, and saves one
//! response per task.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_worker::dispatcher::ensure_topic;
use kafka_worker::sim::Script;
use taskfence::testing::PgFixture;
use taskfence::{AttemptOutcome, InputHash, NewTask, PgStore, RequestKey, Status, TaskId, TaskStore};
use taskfence_test_support::eventually_every;
use taskfence_test_support::process::ChildProcess;

use support::{GroupProbe, KafkaBroker};

const PARTITIONS: i32 = 2;
const TASKS: usize = 10;

fn payload(i: usize) -> String {
    if i % 4 == 1 {
        format!("slow:message {i}")
    } else {
        format!("message {i}")
    }
}

/// Starts the service as `worker`, logging to a temporary file.
fn service(worker: &str, fixture: &PgFixture, bootstrap: &str, topic: &str, group: &str) -> ChildProcess {
    let log_path = std::env::temp_dir().join(format!("kafka-worker-{worker}-{topic}.log"));
    eprintln!("{worker} log: {}", log_path.display());
    let log = std::fs::File::create(&log_path).expect("log file");
    #[rustfmt::skip]
    let args = [
        "--database-url", fixture.url(), "--schema", fixture.schema(),
        "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--worker-id", worker,
        // Short leases and sessions: the takeover after the crash waits for both.
        "--lease", "3s", "--session-timeout", "6s", "--retry-delay", "200ms", "--per-partition", "8",
        "--provider", "simulated", "--sim-min-latency", "50ms", "--sim-max-latency", "200ms",
        "--sim-slow-latency", "4s", "--dispatch-idle", "200ms", "--shutdown-grace", "10s",
    ];
    ChildProcess::spawn(
        worker,
        Command::new(env!("CARGO_BIN_EXE_kafka-worker"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("TASKFENCE_KAFKA_BOOTSTRAP")
            .env("RUST_LOG", "info,kafka_worker=debug")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log)),
    )
}

async fn statuses(pg: &PgStore, tasks: &[TaskId]) -> Vec<Status> {
    let mut out = Vec::new();
    for id in tasks {
        out.push(pg.get(*id).await.expect("get").expect("task").status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_nothing_a_restarted_service_finishes_every_task() {
    let broker = KafkaBroker::start();
    let fixture = taskfence_test_support::fixture().await;
    let pg = fixture.pg_store();
    let run = TaskId::new();
    let (topic, group) = (format!("handoffs-{run}"), format!("reply-workers-{run}"));
    ensure_topic(broker.bootstrap(), &topic, PARTITIONS)
        .await
        .expect("topic");
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let task = NewTask::new(
            RequestKey::new("user-1", "chat.reply", format!("req-{i}")),
            InputHash::of([format!("message-{i}")]),
        )
        .payload(payload(i));
        tasks.push(pg.submit(task).await.expect("submit").into_task().id);
    }
    let slow: Vec<bool> = (0..TASKS)
        .map(|i| Script::of(payload(i).as_bytes()) == Script::Slow)
        .collect();

    // The first service: wait until it holds every slow task, then kill it hard.
    let mut first = service("first", &fixture, broker.bootstrap(), &topic, &group);
    let (tasks_ref, slow_ref) = (&tasks, &slow);
    eventually_every(
        Duration::from_secs(120),
        Duration::from_millis(50),
        || async move {
            let now = statuses(pg, tasks_ref).await;
            let held = now
                .iter()
                .zip(slow_ref)
                .all(|(status, slow)| *status == if *slow { Status::Running } else { Status::Completed });
            held.then_some(())
        },
    )
    .await;
    let status = first.kill_hard().await;
    assert!(!status.success(), "killed, not exited: {status}");
    let after_kill = statuses(pg, &tasks).await;
    assert!(
        after_kill
            .iter()
            .zip(&slow)
            .all(|(status, slow)| !slow || *status == Status::Running),
        "the slow tasks were left running with live leases: {after_kill:?}"
    );

    // The second service: takes over and finishes everything.
    let restarted = Instant::now();
    let mut second = service("second", &fixture, broker.bootstrap(), &topic, &group);
    let probe = GroupProbe::new(broker.bootstrap(), &group, &topic, PARTITIONS);
    let probe_ref = &probe;
    eventually_every(
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async move {
            let done = statuses(pg, tasks_ref)
                .await
                .iter()
                .all(|s| *s == Status::Completed);
            let committed = probe_ref
                .positions()
                .iter()
                .all(|(committed, end)| *committed == Some(*end));
            (done && committed).then_some(())
        },
    )
    .await;
    let finished_in = restarted.elapsed();
    second.signal("TERM");
    let status = second.wait_exit(Duration::from_secs(30)).await.expect("exit");
    assert!(status.success(), "exit status {status}");

    for (id, slow) in tasks.iter().zip(&slow) {
        let task = pg.get(*id).await.unwrap().unwrap();
        let attempts = pg.attempts(*id).await.unwrap();
        let saved: Vec<&str> = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .map(|a| a.worker.as_str())
            .collect();
        assert_eq!(task.status, Status::Completed);
        assert!(task.response.is_some());
        if *slow {
            assert_eq!(saved, ["second"], "{id}: taken over after the crash, saved once");
            assert_eq!(attempts.len(), 2, "{id}: the crashed attempt stays counted");
            assert_eq!(attempts[0].worker, "first");
            assert_ne!(attempts[0].outcome, AttemptOutcome::Completed);
        } else {
            assert_eq!(saved.len(), 1, "{id}: one saved response");
            assert_eq!(
                attempts.len(),
                1,
                "{id}: a re-read completed task is not attempted again"
            );
        }
    }
    eprintln!(
        "figures (crash): {TASKS} tasks, {} slow ones taken over; restarted service finished and committed everything in {finished_in:.1?}",
        slow.iter().filter(|s| **s).count()
    );
}
