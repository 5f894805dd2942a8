//! The demo (`cargo run -p demo`) run in-process with fixed seeds. Its
//! guarantees are checked here against the store's own records (`get`,
//! `attempts`, `find`, `submit`, `claim`), not only against the demo's counts.
//! It also runs on PostgreSQL (the server of `taskfence-test-support`), as
//! `--database-url` does.

use std::sync::Arc;
use std::time::Duration;

use taskfence::intercept::{Intercept, Intercepted};
use taskfence::{Claim, ClaimRequest, Error, Fenced, MemoryStore, NewTask, Status, Task, TaskStore};

use demo::report;
use demo::sim::{self, Config, Outcome};
use demo::timebase::Timebase;

/// Runs the demo on a fresh `MemoryStore` with simulated time; returns the store too.
async fn run_simulated(config: &Config) -> (Outcome, Arc<dyn TaskStore>) {
    let (tb, clock) = Timebase::new_virtual();
    let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::with_clock(clock));
    let outcome = sim::run(config, store.clone(), tb, &mut |_| {})
        .await
        .expect("the memory store does not fail");
    (outcome, store)
}

fn id_of(outcome: &Outcome, task: usize) -> taskfence::TaskId {
    outcome.tasks[task].id.expect("every planned task was created")
}

/// Every task of the run as the store holds it, each checked against the
/// store's records: within its budget, one attempt per claim, and either
/// completed with the run's accepted reply or failed with none.
async fn stored_tasks(outcome: &Outcome, store: &dyn TaskStore) -> Vec<Task> {
    let mut tasks = Vec::with_capacity(outcome.tasks.len());
    for (i, record) in outcome.tasks.iter().enumerate() {
        let id = id_of(outcome, i);
        let task = store.get(id).await.unwrap().expect("the task exists");
        let attempts = store.attempts(id).await.unwrap();
        assert!(
            task.attempts() <= task.policy.max_attempts,
            "{}: {} attempts over a budget of {}",
            record.plan.label,
            task.attempts(),
            task.policy.max_attempts
        );
        assert_eq!(
            attempts.len() as u64,
            task.version,
            "{}: one attempt per claim",
            record.plan.label
        );
        match task.status {
            Status::Completed => assert_eq!(task.response.as_ref(), record.accepted.first()),
            Status::Failed => assert!(record.accepted.is_empty() && task.response.is_none()),
            other => panic!("{} ended {other}", record.plan.label),
        }
        tasks.push(task);
    }
    tasks
}

#[tokio::test]
async fn default_run_saves_one_reply_per_completed_task() {
    let (outcome, store) = run_simulated(&Config::default()).await;
    let s = &outcome.summary;
    assert!(s.invariant_holds(), "violations: {:?}", s.violations);

    let mut completed = 0;
    let mut failed = 0;
    let tasks = stored_tasks(&outcome, store.as_ref()).await;
    for (record, task) in outcome.tasks.iter().zip(tasks) {
        match task.status {
            Status::Completed => {
                completed += 1;
                assert_eq!(
                    record.accepted.len(),
                    1,
                    "{}: one accepted completion",
                    record.plan.label
                );
                // Done means done: another delivery now gets the saved reply and starts nothing.
                let again = store
                    .claim(task.id, ClaimRequest::new("late-worker", Duration::from_secs(30)))
                    .await
                    .unwrap();
                assert!(
                    matches!(again, Claim::Completed(t) if t.response == task.response && t.version == task.version)
                );
            }
            _ => failed += 1,
        }
    }
    assert_eq!(completed, s.completed_tasks);
    assert_eq!(s.saved_replies, completed, "one saved reply per completed task");
    assert_eq!(failed, s.exhausted_tasks);
    assert_eq!(outcome.tasks.len(), Config::default().tasks);
    assert!(s.provider_calls >= s.saved_replies);

    // Every provider call was made under a claim the store recorded, one call per claim.
    let mut seen = std::collections::HashSet::new();
    for call in &outcome.provider_calls {
        assert!(
            seen.insert((call.task, call.version)),
            "two provider calls under one claim"
        );
        let attempts = store.attempts(id_of(&outcome, call.task)).await.unwrap();
        assert!(attempts.iter().any(|a| u64::from(a.number) == call.version));
    }
}

#[tokio::test]
async fn default_run_meets_every_fault_kind() {
    let (outcome, _store) = run_simulated(&Config::default()).await;
    let s = &outcome.summary;
    assert!(s.resends_deduplicated > 0, "network retries of a Send");
    assert!(s.conflicts_rejected > 0, "reused keys");
    assert!(s.regenerates > 0, "Regenerates");
    assert!(
        s.extra_copies_delivered > 0 && s.redeliveries > 0,
        "duplicate deliveries"
    );
    assert!(s.crashes > 0, "crashes after the provider answered");
    assert!(s.pauses > 0, "workers paused past the lease");
    assert!(
        s.lost_store_acks > 0 && s.lost_deletes > 0,
        "lost acknowledgements"
    );
    assert!(s.exhausted_tasks > 0, "budgets run out");
    assert!(s.stale_completions() > 0, "stale completions rejected");
    assert!(s.claims_completed > 0, "duplicates answered from the saved reply");
    assert!(s.renewals > 0, "long answers renew their lease");
}

#[tokio::test]
async fn reused_keys_are_rejected_and_regenerates_are_new_tasks() {
    let (outcome, store) = run_simulated(&Config::default()).await;
    assert!(!outcome.conflicts.is_empty());
    for conflict in &outcome.conflicts {
        let original = id_of(&outcome, conflict.original);
        assert_eq!(
            conflict.rejected_naming,
            Some(original),
            "KeyConflict names the key's task"
        );
        let bound = store
            .find(&conflict.key)
            .await
            .unwrap()
            .expect("the key is bound");
        assert_eq!(bound.id, original);
        assert_ne!(
            bound.input_hash, conflict.input_hash,
            "the other inputs were not written"
        );
        // The store still refuses it now.
        let again = store
            .submit(NewTask::new(conflict.key.clone(), conflict.input_hash))
            .await;
        assert!(matches!(again, Err(Error::KeyConflict { existing }) if existing == original));
    }

    let regenerates: Vec<_> = outcome
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.plan.regenerate_of.map(|of| (i, of)))
        .collect();
    assert!(!regenerates.is_empty());
    for (regenerate, of) in regenerates {
        let new = store.get(id_of(&outcome, regenerate)).await.unwrap().unwrap();
        let old = store.get(id_of(&outcome, of)).await.unwrap().unwrap();
        assert_ne!(new.id, old.id, "a Regenerate is a second task");
        assert_eq!(new.input_hash, old.input_hash, "with the same inputs");
        assert_ne!(new.key, old.key, "under a new request key");
    }
}

#[tokio::test]
async fn the_same_seed_replays_the_same_run() {
    let config = Config::default();
    let (first, _) = run_simulated(&config).await;
    let (second, _) = run_simulated(&config).await;
    assert_eq!(first.summary, second.summary);
    assert_eq!(first.timeline, second.timeline);
    assert_eq!(first.provider_calls, second.provider_calls);

    let (other, _) = run_simulated(&Config { seed: 7, ..config }).await;
    assert_ne!(first.summary, other.summary, "another seed draws another run");
    assert!(
        other.summary.invariant_holds(),
        "violations: {:?}",
        other.summary.violations
    );
}

#[tokio::test]
async fn the_printed_story_shows_the_takeover_and_ends_with_the_invariant() {
    let config = Config::default();
    let (outcome, _) = run_simulated(&config).await;
    let text = report::render(
        &outcome,
        &report::RunInfo {
            backend: "MemoryStore".into(),
            config,
            elapsed: Duration::ZERO,
        },
    );
    let timeline = outcome
        .timeline
        .entries
        .iter()
        .map(|e| format!("{} {}", e.actor, e.text))
        .collect::<Vec<_>>();
    let has = |needle: &str| timeline.iter().any(|line| line.contains(needle));
    // The scripted conversation: the paused worker is fenced off by the takeover.
    assert!(
        has("late complete T1 v1 → Rejected: Superseded { current_version: 2 }"),
        "{timeline:#?}"
    );
    assert!(has("complete T1 v2 → Accepted"));
    assert!(has(
        "network retry of Send 1 (same key, same inputs) → existing T1"
    ));
    assert!(has(
        "reuses T1's key send-1 for message 2 → KeyConflict (other inputs) naming T1"
    ));
    assert!(has("new task T3; same inputs as T2"));
    assert!(has("crashes before saving"));
    assert!(has("renews T3 v1 during a long answer"));
    assert!(has("fail T4 v3 (retryable) → Exhausted"));
    assert!(has(
        "claim T1 → Completed: the saved reply comes back, no provider call"
    ));
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("invariant: one saved reply per completed task: OK"),
        "{last}"
    );
}

#[tokio::test]
async fn the_invariant_holds_across_seeds_and_fault_rates() {
    for seed in 0..12 {
        let config = Config {
            seed,
            tasks: 150,
            workers: 1 + (seed as usize % 5),
            faults: [0.05, 0.3, 0.8][seed as usize % 3],
            run: 0,
        };
        let (outcome, _) = run_simulated(&config).await;
        let s = &outcome.summary;
        assert!(s.invariant_holds(), "{config:?}: {:?}", s.violations);
        assert_eq!(s.completed_tasks + s.exhausted_tasks, 150, "{config:?}");
    }
}

#[tokio::test]
async fn a_fault_free_run_has_nothing_to_reject() {
    let (outcome, _) = run_simulated(&Config {
        faults: 0.0,
        tasks: 60,
        ..Config::default()
    })
    .await;
    let s = &outcome.summary;
    assert!(s.invariant_holds(), "violations: {:?}", s.violations);
    assert_eq!(s.completed_tasks, 60);
    assert_eq!(
        (
            s.stale_completions(),
            s.crashes,
            s.pauses,
            s.exhausted_tasks,
            s.conflicts_rejected
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(s.duplicate_deliveries(), 0);
    assert_eq!(s.provider_calls, 60);
}

/// The real-time path (`--real-time`, and `--database-url`): the store reads
/// the system clock and the simulation sleeps. Timing varies, the invariant does not.
#[tokio::test]
async fn a_real_time_run_keeps_the_invariant() {
    let config = Config {
        tasks: 24,
        faults: 0.3,
        ..Config::default()
    };
    let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    let outcome = sim::run(&config, store, Timebase::new_real(), &mut |_| {})
        .await
        .unwrap();
    let s = &outcome.summary;
    assert!(s.invariant_holds(), "violations: {:?}", s.violations);
    assert_eq!(s.completed_tasks + s.exhausted_tasks, 24);
}

#[test]
fn flags_out_of_range_are_refused() {
    let bad = [
        Config {
            tasks: 0,
            ..Config::default()
        },
        Config {
            workers: 0,
            ..Config::default()
        },
        Config {
            faults: 1.5,
            ..Config::default()
        },
        Config {
            faults: f64::NAN,
            ..Config::default()
        },
    ];
    for config in bad {
        assert!(config.validate().is_err(), "{config:?}");
    }
    assert!(Config::default().validate().is_ok());
}

/// A broken backend: it answers `Accepted` to a completion the real store
/// refused (a stale worker's late answer). The demo's check must catch it.
struct AcceptsStaleCompletions;

#[async_trait::async_trait]
impl Intercept for AcceptsStaleCompletions {
    async fn complete(
        &self,
        inner: &dyn TaskStore,
        lease: taskfence::Lease,
        response: taskfence::Response,
    ) -> taskfence::Result<Fenced<taskfence::Task>> {
        let id = lease.task_id();
        match inner.complete(lease, response).await? {
            Fenced::Rejected(_) => Ok(Fenced::Accepted(inner.get(id).await?.expect("exists"))),
            accepted => Ok(accepted),
        }
    }
}

#[tokio::test]
async fn the_check_catches_a_store_that_accepts_stale_completions() {
    let (tb, clock) = Timebase::new_virtual();
    let store: Arc<dyn TaskStore> = Arc::new(Intercepted::new(
        Arc::new(MemoryStore::with_clock(clock)),
        AcceptsStaleCompletions,
    ));
    let config = Config::default();
    let outcome = sim::run(&config, store, tb, &mut |_| {}).await.unwrap();
    let s = &outcome.summary;
    assert!(!s.invariant_holds());
    assert!(
        s.violations
            .iter()
            .any(|v| v.starts_with("T1: completed, with 2 accepted completions")),
        "{:#?}",
        s.violations
    );
    let text = report::render(
        &outcome,
        &report::RunInfo {
            backend: "a broken store".into(),
            config,
            elapsed: Duration::ZERO,
        },
    );
    assert!(text.lines().last().unwrap().contains("VIOLATED"));
}

/// `--database-url`: the demo on PostgreSQL, in a fresh schema, on real time.
/// Timing varies from run to run; what is asserted does not: the invariant,
/// every task ended within its budget, and the scripted paused worker's late
/// answer was refused.
#[tokio::test]
async fn the_demo_keeps_the_invariant_on_postgres() {
    use taskfence::testing::Fixture;

    let fixture = taskfence_test_support::fixture().await;
    let store = fixture.store();
    let config = Config {
        tasks: 40,
        ..Config::default()
    };
    let outcome = sim::run(&config, store.clone(), Timebase::new_real(), &mut |_| {})
        .await
        .expect("the server stays up");
    let s = &outcome.summary;
    assert!(s.invariant_holds(), "violations: {:?}", s.violations);
    assert_eq!(s.completed_tasks + s.exhausted_tasks, 40);
    assert!(
        s.stale_completions() > 0,
        "the paused worker's late answer was refused"
    );
    assert!(s.conflicts_rejected > 0 && s.resends_deduplicated > 0 && s.regenerates > 0);
    stored_tasks(&outcome, store.as_ref()).await;
}

/// `--sqlite PATH`: the story runs on a durable file, and a second run finds
/// the first run's tasks there and adds its own beside them.
#[test]
fn a_second_sqlite_run_finds_the_first_runs_tasks() {
    let dir = std::env::temp_dir().join(format!("taskfence-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("demo.db");
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_demo"))
            .args(["--tasks", "30", "--sqlite"])
            .arg(&file)
            .output()
            .expect("run the demo")
    };
    let first = run();
    let first_out = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{first_out}");
    assert!(first_out.contains("is new: this is its first run"), "{first_out}");
    assert!(first_out.contains("invariant: one saved reply per completed task: OK"));
    let second = run();
    let second_out = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{second_out}");
    assert!(
        second_out.contains("holds 30 tasks from 1 earlier run(s)"),
        "{second_out}"
    );
    assert!(second_out.contains("invariant: one saved reply per completed task: OK"));
    std::fs::remove_dir_all(&dir).unwrap();
}
