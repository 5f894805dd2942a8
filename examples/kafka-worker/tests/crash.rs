//! The worker service killed with SIGKILL while it holds tasks: nothing is
//! lost. A second service in the same group re-reads from the committed
//! offset, takes the tasks over once their leases expire, and saves one
//! response per task.

mod support;

use std::time::{Duration, Instant};

use kafka_worker::sim::Script;
use taskfence::store::AttemptOutcome;
use taskfence::{PgStore, Status, TaskId, TaskStore};
use taskfence_test_support::eventually_every;

use support::{GroupProbe, ServiceRun};

const PARTITIONS: i32 = 2;
const TASKS: usize = 10;

fn payload(i: usize) -> String {
    if i % 4 == 1 {
        format!("slow:message {i}")
    } else {
        format!("message {i}")
    }
}

/// Short leases and sessions: the takeover after the crash waits for both.
#[rustfmt::skip]
const SERVICE_ARGS: [&str; 16] = [
    "--lease", "3s", "--session-timeout", "6s", "--retry-delay", "200ms", "--concurrency", "16",
    "--sim-min-latency", "50ms", "--sim-max-latency", "200ms", "--sim-slow-latency", "4s",
    "--shutdown-grace", "10s",
];

async fn statuses(pg: &PgStore, tasks: &[TaskId]) -> Vec<Status> {
    let mut out = Vec::new();
    for id in tasks {
        out.push(pg.get(*id).await.expect("get").expect("task").status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_nothing_a_restarted_service_finishes_every_task() {
    let run = ServiceRun::start(PARTITIONS, (0..TASKS).map(payload)).await;
    let pg = run.pg();
    let tasks: Vec<TaskId> = run.tasks.iter().map(|t| t.id).collect();
    let slow: Vec<bool> = (0..TASKS)
        .map(|i| Script::of(payload(i).as_bytes()) == Script::Slow)
        .collect();

    // The first service: wait until it holds every slow task, then kill it hard.
    let (mut first, _) = run.service("first", &SERVICE_ARGS, &[]);
    eventually_every(Duration::from_secs(120), Duration::from_millis(50), || async {
        let now = statuses(pg, &tasks).await;
        let held = now
            .iter()
            .zip(&slow)
            .all(|(status, slow)| *status == if *slow { Status::Running } else { Status::Completed });
        held.then_some(())
    })
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
    let (mut second, _) = run.service("second", &SERVICE_ARGS, &[]);
    let probe = GroupProbe::new(run.broker.bootstrap(), &run.group, &run.topic, PARTITIONS);
    eventually_every(Duration::from_secs(120), Duration::from_millis(100), || async {
        let done = statuses(pg, &tasks).await.iter().all(|s| *s == Status::Completed);
        let committed = probe
            .positions()
            .iter()
            .all(|(committed, end)| *committed == Some(*end));
        (done && committed).then_some(())
    })
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
