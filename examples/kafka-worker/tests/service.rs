//! The worker service binary against tansu and PostgreSQL: it consumes until
//! SIGTERM, then finishes what it can within `--shutdown-grace`, releases the
//! rest, commits only safe offsets and exits 0.

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kafka_worker::PgPositions;
use kafka_worker::dispatcher::{ensure_topic, task_id};
use kafka_worker::sim::Script;
use taskfence::{AttemptOutcome, InputHash, NewTask, RequestKey, Status, TaskId, TaskStore};
use taskfence_test_support::eventually_every;
use taskfence_test_support::process::ChildProcess;

use support::{GroupProbe, KafkaBroker, read_topic};

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

/// Where the service keeps its positions (`--positions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Positions {
    Group,
    Postgres,
}

async fn scenario(mode: Positions) {
    let broker = KafkaBroker::start();
    let fixture = taskfence_test_support::fixture().await;
    let pg = fixture.pg_store();
    let run = TaskId::new();
    let (topic, group) = (format!("handoffs-{run}"), format!("reply-workers-{run}"));
    ensure_topic(broker.bootstrap(), &topic, PARTITIONS)
        .await
        .expect("topic");

    // Submitted before the service starts: its dispatcher publishes the outbox.
    let mut tasks = Vec::new();
    for i in 0..14 {
        let task = NewTask::new(
            RequestKey::new("user-1", "chat.reply", format!("req-{i}")),
            InputHash::of([format!("message-{i}")]),
        )
        .payload(payload(i));
        tasks.push(pg.submit(task).await.expect("submit").into_task());
    }
    let script = |id: TaskId| {
        let i = tasks.iter().position(|t| t.id == id).expect("a submitted task");
        Script::of(payload(i).as_bytes())
    };

    let log_path = std::env::temp_dir().join(format!("kafka-worker-service-{run}.log"));
    let log = std::fs::File::create(&log_path).expect("log file");
    eprintln!("service log: {}", log_path.display());
    let positions = match mode {
        Positions::Group => "group",
        Positions::Postgres => "postgres",
    };
    let (slow, grace) = (format!("{}s", SLOW.as_secs()), format!("{}s", GRACE.as_secs()));
    #[rustfmt::skip]
    let args = [
        "--database-url", fixture.url(), "--schema", fixture.schema(),
        "--bootstrap", broker.bootstrap(), "--topic", &topic, "--group", &group,
        "--positions", positions, "--worker-id", "service-1", "--per-partition", "8", "--lease", "6s",
        "--provider", "simulated", "--sim-min-latency", "100ms", "--sim-max-latency", "400ms",
        "--sim-slow-latency", &slow, "--dispatch-idle", "200ms",
    ];
    let mut service = ChildProcess::spawn(
        "kafka-worker",
        Command::new(env!("CARGO_BIN_EXE_kafka-worker"))
            .args(args)
            // No settings leak in from the test's environment; these two are
            // set through the environment on purpose, to prove it is read.
            .env_remove("DATABASE_URL")
            .env_remove("TASKFENCE_KAFKA_BOOTSTRAP")
            .env("TASKFENCE_SHUTDOWN_GRACE", &grace)
            .env("RUST_LOG", "info,kafka_worker=debug")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log)),
    );

    // Held: every quick task done, every slow and hanging one claimed and running.
    let started = Instant::now();
    let tasks_ref = &tasks;
    eventually_every(
        Duration::from_secs(120),
        Duration::from_millis(50),
        || async move {
            for t in tasks_ref {
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
        },
    )
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
    for t in &tasks {
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
        log_text.contains("DEBUG kafka_worker::journal"),
        "RUST_LOG turned on the journal's debug events"
    );

    // The committed offsets: never past an unfinished record, and up to the
    // end of every partition where nothing was left unfinished.
    let records = read_topic(broker.bootstrap(), &topic, PARTITIONS);
    let mut by_partition: HashMap<i32, Vec<(i64, TaskId)>> = HashMap::new();
    for (p, offset, payload) in &records {
        let id = task_id(payload.as_deref()).expect("a handoff names its task");
        by_partition.entry(*p).or_default().push((*offset, id));
    }
    let probe = GroupProbe::new(broker.bootstrap(), &group, &topic, PARTITIONS);
    let mut positions = probe.positions();
    if mode == Positions::Postgres {
        // The group's offsets are unused in this mode: the table is the position.
        let saved = PgPositions::new(pg, &group)
            .await
            .unwrap()
            .load(&topic, &[0, 1])
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
