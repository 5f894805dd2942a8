//! The conformance scenarios' histories on real stores, recorded
//! (`taskfence::testing::trace`) and replayed against the model
//! ([`replay`](crate::replay)); and traces tampered with, which it rejects.
//!
//! Each history is written to `target/traces/<backend>/<scenario>.jsonl`
//! and read back from there, so what is checked is the file format too.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Instant;

use taskfence::testing::trace::{Recording, Step};
use taskfence::testing::{Fixture, MemoryFixture, PgFixture};

use crate::replay::{parse, replay, to_jsonl};

type Run<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;
type Scenario = for<'a> fn(&'a dyn Fixture) -> Run<'a>;

macro_rules! scenario_table {
    ($($name:ident),* $(,)?) => {
        /// Every conformance scenario, by name.
        fn scenarios() -> Vec<(&'static str, Scenario)> {
            vec![$({
                fn $name(f: &dyn Fixture) -> Run<'_> {
                    Box::pin(taskfence::testing::scenarios::$name(f))
                }
                (stringify!($name), $name as Scenario)
            }),*]
        }
    };
}

taskfence::__conformance_scenarios!(scenario_table {});

fn trace_dir(backend: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/traces")
        .join(backend);
    std::fs::create_dir_all(&dir).expect("trace directory");
    dir
}

/// Runs every `every`-th scenario (1: all of them) on a fresh recording
/// fixture from `fixture`, writes each history, reads it back and replays it.
async fn record_and_replay<F: Fixture + 'static, Fut: Future<Output = F>>(
    backend: &str,
    every: usize,
    fixture: impl Fn() -> Fut,
) {
    let started = Instant::now();
    let dir = trace_dir(backend);
    let (mut total, mut ran) = (0, 0);
    for (name, scenario) in scenarios().into_iter().step_by(every) {
        ran += 1;
        let recording = Recording::new(fixture().await);
        scenario(&recording).await;
        let path = dir.join(format!("{name}.jsonl"));
        std::fs::write(&path, to_jsonl(&recording.steps())).expect("write the trace");
        let steps = parse(&std::fs::read_to_string(&path).expect("read the trace")).expect("parse the trace");
        match replay(&steps) {
            Ok(n) => total += n,
            Err(why) => panic!("{backend}, {name} ({}): {why}", path.display()),
        }
    }
    println!(
        "{backend}: {ran} scenarios, {total} steps replayed, in {:.1?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_histories_on_memory_replay() {
    record_and_replay("memory", 1, || async { MemoryFixture::new() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_histories_on_postgres_replay() {
    record_and_replay("postgres", 1, PgFixture::new).await;
}

/// Every eighth scenario on moto in the test command; all of them (about 4.5
/// minutes: moto serves one request at a time, and every step is read back
/// twice) with `TASKFENCE_TRACE_DYNAMODB=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_histories_on_dynamodb_replay() {
    let every = if std::env::var_os("TASKFENCE_TRACE_DYNAMODB").is_some() {
        1
    } else {
        8
    };
    record_and_replay("dynamodb", every, taskfence_test_support::dynamo::fixture).await;
}

/// The history of one scenario on `MemoryStore`.
async fn history(scenario: &str) -> Vec<Step> {
    let (_, run) = scenarios()
        .into_iter()
        .find(|(name, _)| *name == scenario)
        .expect("a scenario of that name");
    let recording = Recording::new(MemoryFixture::new());
    run(&recording).await;
    let steps = recording.steps();
    replay(&steps).unwrap_or_else(|why| panic!("the untampered history fails: {why}"));
    steps
}

fn rejected(steps: &[Step], words: &[&str]) {
    let why = replay(steps).expect_err("a tampered history must not replay");
    println!("{why}");
    for word in words {
        assert!(why.contains(word), "the message should say {word:?}: {why}");
    }
}

#[tokio::test]
async fn a_stale_completion_shown_accepted_is_rejected() {
    let mut steps = history("paused_worker_after_takeover_is_rejected").await;
    let i = steps
        .iter()
        .position(|s| s.op == "complete" && s.outcome == "rejected")
        .expect("a refused completion");
    // The store's answer and the task it left, as if it had saved the stale response.
    let step = &mut steps[i];
    step.outcome = "accepted".to_owned();
    step.reason = None;
    let seen = &mut step.tasks[0];
    let mut saved = seen.before.clone().expect("the task");
    saved.status = taskfence::Status::Completed;
    saved.response = Some(taskfence::Response::from("stale"));
    saved.lease_until = None;
    seen.after = Some(saved);
    rejected(
        &steps,
        &[
            &format!("step {i} (complete"),
            "the store accepted it, but the model refuses it",
            "superseded",
        ],
    );
}

#[tokio::test]
async fn an_attempt_over_the_budget_is_rejected() {
    let mut steps = history("max_attempts_exhausted_is_terminal").await;
    let i = steps
        .iter()
        .position(|s| s.op == "claim" && s.outcome == "failed")
        .expect("a claim that found the budget spent");
    let step = &mut steps[i];
    step.outcome = "acquired".to_owned();
    let seen = &mut step.tasks[0];
    // Granted at the instant the store failed it instead.
    let now = seen
        .after
        .as_ref()
        .and_then(|t| t.finished_at)
        .expect("failed at");
    let mut taken = seen.before.clone().expect("the task");
    taskfence::backend::rules::taken(&mut taken, now + step.duration.unwrap_or_default());
    seen.after = Some(taken);
    rejected(
        &steps,
        &[
            &format!("step {i} (claim"),
            "the store granted assignment",
            "attempts in a budget of",
        ],
    );
}

#[tokio::test]
async fn a_change_with_no_step_is_rejected() {
    let mut steps = history("release_gives_task_back_and_keeps_attempt").await;
    // Drop the release: the task is found pending with nothing that made it so.
    let i = steps.iter().position(|s| s.op == "release").expect("a release");
    steps.remove(i);
    rejected(&steps, &["changed with no step recorded"]);
}
