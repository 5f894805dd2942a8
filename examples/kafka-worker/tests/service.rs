//! The worker service binary against tansu and PostgreSQL: it consumes until
//! SIGTERM, then finishes what it can within `--shutdown-grace`, releases the
//! rest, commits only safe offsets and exits 0.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use kafka_worker::sim::Script;
use taskfence::store::AttemptOutcome;
use taskfence::{Status, TaskId, TaskStore};
use taskfence_kafka::dispatcher::task_id;
use taskfence_kafka::{PgPositions, Positions};
use taskfence_test_support::eventually_every;

use support::{GroupProbe, ServiceRun, read_topic};

const PARTITIONS: i32 = 2;
/// Longer than the slow tasks' remaining time at SIGTERM (at most `SLOW`),
/// far shorter than the hanging ones.
const GRACE: Duration = Duration::from_secs(12);
const SLOW: Duration = Duration::from_secs(8);

fn payload(i: usize) -> String {
    match i {
        3 | 9 => format!("slow:message {i}"),
        5 | 11 => format!("hang:message {i}"),
        i => format!("message {i}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_or_releases_held_tasks_and_commits_only_safe_offsets() {
    scenario(Positions::Group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_in_postgres_position_mode_saves_only_safe_positions() {
    scenario(Positions::Postgres).await;
}

async fn scenario(mode: Positions) {
    // Submitted before the service starts: its dispatcher publishes the outbox.
    let run = ServiceRun::start(PARTITIONS, (0..14).map(payload)).await;
    let (pg, tasks) = (run.pg(), &run.tasks);
    let script = |id: TaskId| {
        let i = tasks.iter().position(|t| t.id == id).expect("a submitted task");
        Script::of(payload(i).as_bytes())
    };

    let positions = mode.to_possible_value().expect("a named mode");
    let (slow, grace) = (format!("{}s", SLOW.as_secs()), format!("{}s", GRACE.as_secs()));
    #[rustfmt::skip]
    let args = [
        "--positions", positions.get_name(), "--concurrency", "16", "--lease", "6s",
        "--sim-min-latency", "100ms", "--sim-max-latency", "400ms", "--sim-slow-latency", &slow,
    ];
    // The grace goes through the environment on purpose, to prove it is read.
    let (mut service, log_path) = run.service("service-1", &args, &[("TASKFENCE_SHUTDOWN_GRACE", &grace)]);

    // Held: every quick task done, every slow and hanging one claimed and running.
    let started = Instant::now();
    eventually_every(Duration::from_secs(120), Duration::from_millis(50), || async {
        for t in tasks {
            let status = pg.get(t.id).await.expect("get").expect("task").status;
            let want = match script(t.id) {
                Script::Slow | Script::Hang => Status::Running,
                _ => Status::Completed,
            };
            if status != want {
                return None;
            }
        }
        Some(())
    })
    .await;
    let held_after = started.elapsed();
    assert!(service.try_exit().is_none(), "the service is still running");

    let sigterm = Instant::now();
    service.signal("TERM");
    let status = service
        .wait_exit(GRACE + Duration::from_secs(15))
        .await
        .unwrap_or_else(|| {
            panic!(
                "no exit within the grace period (+15 s); log {}",
                log_path.display()
            )
        });
    let stopped_in = sigterm.elapsed();
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "exit status {status}; log:\n{log_text}");
    assert!(
        stopped_in < GRACE + Duration::from_secs(10),
        "stopped after {stopped_in:?}"
    );
    assert!(
        stopped_in >= GRACE,
        "the hanging tasks kept it for the whole grace period, no less: {stopped_in:?}"
    );

    // Every task it held: completed with one saved response, or released
    // (pending again, the attempt counted). None left running.
    let (mut completed, mut released) = (0, 0);
    for t in tasks {
        let task = pg.get(t.id).await.unwrap().unwrap();
        let attempts = pg.attempts(t.id).await.unwrap();
        assert_ne!(task.status, Status::Running, "{}: left running", t.id);
        match script(t.id) {
            Script::Hang => {
                assert_eq!(task.status, Status::Pending, "released: claimable again");
                assert_eq!(task.attempts(), 1, "the released attempt stays counted");
                assert_eq!(attempts.len(), 1);
                assert_eq!(attempts[0].outcome, AttemptOutcome::Released);
                assert!(task.response.is_none());
                released += 1;
            }
            _ => {
                assert_eq!(task.status, Status::Completed);
                let text = task.response.as_ref().and_then(|r| r.as_str()).expect("text");
                assert!(text.starts_with(&format!("reply to {}", String::from_utf8_lossy(&task.payload))));
                let saved = attempts
                    .iter()
                    .filter(|a| a.outcome == AttemptOutcome::Completed)
                    .count();
                assert_eq!(saved, 1, "one saved response");
                completed += 1;
            }
        }
    }
    assert_eq!((completed, released), (12, 2));
    assert!(
        log_text.contains("released=2"),
        "the service reported its releases:\n{log_text}"
    );
    assert!(
        log_text.contains("DEBUG taskfence_kafka::journal"),
        "RUST_LOG turned on the journal's debug events"
    );

    // The committed offsets: never past an unfinished record, and up to the
    // end of every partition where nothing was left unfinished.
    let records = read_topic(run.broker.bootstrap(), &run.topic, PARTITIONS);
    let mut by_partition: HashMap<i32, Vec<(i64, TaskId)>> = HashMap::new();
    for (p, offset, payload) in &records {
        let id = task_id(payload.as_deref()).expect("a handoff names its task");
        by_partition.entry(*p).or_default().push((*offset, id));
    }
    let probe = GroupProbe::new(run.broker.bootstrap(), &run.group, &run.topic, PARTITIONS);
    let mut positions = probe.positions();
    if mode == Positions::Postgres {
        // The group's offsets are unused in this mode: the table is the position.
        let saved = PgPositions::new(pg, &run.group)
            .await
            .unwrap()
            .load(&run.topic, &[0, 1])
            .await
            .unwrap();
        for (p, (committed, _)) in positions.iter_mut().enumerate() {
            *committed = saved.get(&(p as i32)).copied();
        }
    }
    for (p, (committed, end)) in positions.iter().enumerate() {
        let p = p as i32;
        let records = by_partition.get(&p).cloned().unwrap_or_default();
        let committed = committed.unwrap_or(0);
        for (offset, id) in &records {
            if *offset < committed {
                let task = pg.get(*id).await.unwrap().unwrap();
                assert_eq!(
                    task.status,
                    Status::Completed,
                    "partition {p}: committed {committed} passed record {offset}, task {id} not finished"
                );
            }
        }
        let first_unfinished = records
            .iter()
            .filter(|(_, id)| script(*id) == Script::Hang)
            .map(|(offset, _)| *offset)
            .min();
        match first_unfinished {
            Some(offset) => assert_eq!(
                committed, offset,
                "partition {p}: commits stop at the released record"
            ),
            None => assert_eq!(committed, *end, "partition {p}: everything finished is committed"),
        }
    }
    eprintln!(
        "figures (service, {mode:?} positions): {} records; held state reached {held_after:.1?} after start; \
         SIGTERM to exit 0 in {stopped_in:.1?} (grace {GRACE:?}); {completed} completed, {released} released; \
         committed/end per partition {positions:?}",
        records.len()
    );
}
