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

use futures_util::{StreamExt, stream};

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

/// Runs every `every`-th scenario (1: all of them), `side_by_side` at a
/// time, each on a fresh recording fixture from `fixture`; writes each
/// history, reads it back and replays it. A scenario's fixture is its own
/// store (its own schema on PostgreSQL), so scenarios side by side share
/// nothing but the server.
async fn record_and_replay<F: Fixture + 'static, Fut: Future<Output = F>>(
    backend: &str,
    every: usize,
    side_by_side: usize,
    fixture: impl Fn() -> Fut,
) {
    let started = Instant::now();
    let dir = trace_dir(backend);
    let fixture = &fixture;
    let dir = &dir;
    let replayed: Vec<usize> = stream::iter(scenarios().into_iter().step_by(every))
        .map(|(name, scenario)| async move {
            let recording = Recording::new(fixture().await);
            scenario(&recording).await;
            let steps = recording.steps();
            // A fixture's drop may block (a schema to drop): off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || drop(recording)).await;
            let path = dir.join(format!("{name}.jsonl"));
            std::fs::write(&path, to_jsonl(&steps)).expect("write the trace");
            let steps =
                parse(&std::fs::read_to_string(&path).expect("read the trace")).expect("parse the trace");
            match replay(&steps) {
                Ok(n) => n,
                Err(why) => panic!("{backend}, {name} ({}): {why}", path.display()),
            }
        })
        .buffer_unordered(side_by_side)
        .collect()
        .await;
    println!(
        "{backend}: {} scenarios ({side_by_side} side by side), {} steps replayed, in {:.1?}",
        replayed.len(),
        replayed.iter().sum::<usize>(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_histories_on_memory_replay() {
    record_and_replay("memory", 1, 1, || async { MemoryFixture::new() }).await;
}

/// The scenarios side by side, each in a schema of its own, on one pool:
/// a scenario's time is mostly round trips and its schema's migration,
/// which overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_histories_on_postgres_replay() {
    let url = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL must name a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_SIDE_BY_SIDE as u32 * 3)
        .test_before_acquire(false)
        .connect_with(sqlx::ConnectOptions::disable_statement_logging(
            url.parse::<sqlx::postgres::PgConnectOptions>()
                .expect("a valid PostgreSQL URL"),
        ))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}"));
    let (url, pool) = (&url, &pool);
    record_and_replay("postgres", 1, PG_SIDE_BY_SIDE, || {
        PgFixture::on_pool(url, pool.clone())
    })
    .await;
}

/// How many PostgreSQL scenarios run at once.
const PG_SIDE_BY_SIDE: usize = 8;

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
    record_and_replay("dynamodb", every, 1, taskfence_test_support::dynamo::fixture).await;
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

/// An instant just before the current lease of the step's task ends: a
/// tampered write is shown there, where the current assignment's fence passes.
fn live_until(step: &Step) -> time::OffsetDateTime {
    let task = step.tasks[0].before.as_ref().expect("the task");
    task.lease_until.expect("a running task") - std::time::Duration::from_millis(1)
}

#[tokio::test]
async fn an_effect_finished_by_a_superseded_assignment_shown_accepted_is_rejected() {
    let mut steps = history("only_a_current_lease_records_an_effect").await;
    let i = steps
        .iter()
        .position(|s| s.op == "finish_effect" && s.reason.as_deref() == Some("superseded"))
        .expect("a superseded assignment's refused outcome");
    // The store's answer and the record it left, as if it had settled the
    // effect for the superseded assignment.
    let step = &mut steps[i];
    step.outcome = "accepted".to_owned();
    step.reason = None;
    let now = live_until(step);
    let seen = step.effect.as_mut().expect("the effect record, read back");
    let mut settled = seen.before.clone().expect("the paused assignment's intent");
    taskfence::effect::EffectOutcome::done("late").apply(&mut settled, now);
    seen.after = Some(settled);
    rejected(
        &steps,
        &[
            &format!("step {i} (finish_effect"),
            "the store accepted it, but the model refuses it",
            "superseded",
        ],
    );
}

#[tokio::test]
async fn a_done_effect_called_again_is_rejected() {
    let mut steps = history("a_done_effect_is_skipped_by_later_attempts").await;
    let i = steps
        .iter()
        .rposition(|s| s.op == "begin_effect")
        .expect("the second attempt's begin");
    assert_eq!(steps[i].reason.as_deref(), Some("done"), "skipped, untampered");
    // The second attempt told to call again, its intent written over the
    // done record: the fence passes and the task is unchanged, so only the
    // effect record shows it.
    let step = &mut steps[i];
    step.reason = Some("call".to_owned());
    let now = live_until(step);
    let seen = step.effect.as_mut().expect("the effect record, read back");
    let done = seen.before.clone().expect("the first attempt's record");
    let mut again = taskfence::effect::Effect::intended(done.task_id, &done.name, 2, 2, now);
    again.created_at = done.created_at;
    seen.after = Some(again);
    rejected(
        &steps,
        &[
            &format!("step {i} (begin_effect"),
            "the store answered accepted (call), the model answers accepted (done)",
        ],
    );
}

#[tokio::test]
async fn an_effect_record_changed_with_no_step_is_rejected() {
    let mut steps = history("an_intent_without_outcome_is_retried_under_the_retry_policy").await;
    let i = steps
        .iter()
        .rposition(|s| s.op == "finish_effect")
        .expect("the second attempt's outcome");
    // The record the outcome found is not the one the last begin left.
    let seen = steps[i].effect.as_mut().expect("the effect record, read back");
    let before = seen.before.as_mut().expect("the intent");
    before.ambiguous = 0;
    rejected(
        &steps,
        &[
            &format!("step {i} (finish_effect"),
            "changed with no step recorded",
        ],
    );
}
