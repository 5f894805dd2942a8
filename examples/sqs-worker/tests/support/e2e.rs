//! The end-to-end scenario both stores run (`tests/e2e.rs` on PostgreSQL,
//! `tests/e2e_dynamodb.rs` on DynamoDB) and the checks on its outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqs_worker::sim::scenario::{self, Report, Scenario, StoreChoice};
use sqs_worker::sim::{CallOutcome, SimulatedConfig, local_sqs_client};
use sqs_worker::{SqsQueue, WorkerConfig};
use taskfence::policy::FailureKind;
use taskfence::store::AttemptOutcome;
use taskfence::{RetryPolicy, Status, TaskStore};

use super::Moto;

/// `tasks` tasks, every message sent twice, 4 workers of `concurrency`
/// tasks each, a visibility timeout shorter than the provider call, and
/// every fault of the simulated LLM.
pub(crate) fn scenario(tasks: usize, concurrency: usize) -> Scenario {
    Scenario {
        tasks,
        lose_first_send_ack: true,
        dispatch_batch: 50,
        workers: 4,
        // Shorter than every provider call: messages stay hidden because each
        // receive asks for lease + slack and each renewal extends it.
        queue_visibility: Duration::from_secs(2),
        lease: Duration::from_secs(5),
        worker: WorkerConfig {
            concurrency,
            poll_wait: Duration::from_secs(1),
            visibility_slack: Duration::from_secs(1),
            ..WorkerConfig::default()
        },
        policy: RetryPolicy::default()
            .max_attempts(6)
            .initial_backoff(Duration::from_millis(500))
            .max_backoff(Duration::from_secs(2)),
        provider: SimulatedConfig {
            min_latency: Duration::from_millis(2500),
            max_latency: Duration::from_millis(3500),
            transient_rate: 0.10,
            ambiguous_rate: 0.03,
            permanent_rate: 0.02,
            crash_after_answer_rate: 0.03,
            stall_after_answer_rate: 0.04,
            // Past the lease and the message's extended visibility: another worker takes over.
            stall_for: Duration::from_secs(9),
            seed: 2026,
        },
        deadline: Duration::from_secs(300),
    }
}

/// Runs [`scenario`] of `tasks` tasks, `concurrency` per worker, on `store_choice` against a fresh queue on
/// `moto`, checks every task and the run (reading the tasks back through
/// `store`, the backend's store), deletes the queue, and returns the report.
pub(crate) async fn run_and_check(
    moto: &Moto,
    prefix: &str,
    tasks: usize,
    concurrency: usize,
    store_choice: StoreChoice,
    store: Arc<dyn TaskStore>,
) -> Report {
    let client = local_sqs_client(&moto.endpoint).await;
    let queue_name = format!("{prefix}-{}", uuid::Uuid::now_v7());
    let scenario = scenario(tasks, concurrency);
    let queue = SqsQueue::create(client, &queue_name, scenario.queue_visibility)
        .await
        .expect("create the queue");
    let (report, llm) = scenario::run(&scenario, store_choice, queue.clone())
        .await
        .expect("the run");
    println!("{report}");
    let calls = llm.calls();
    let max_attempts = scenario.policy.max_attempts;

    // The queue is empty: every message was deleted after its task settled.
    assert_eq!(report.left_in_queue, 0, "messages left in the queue\n{report}");

    let mut calls_by_task: HashMap<_, Vec<_>> = HashMap::new();
    for call in &calls {
        calls_by_task.entry(call.task_id).or_default().push(call.clone());
    }
    let saved_by_task = &report.saved_by_task;
    let mut recovered_after_kill = 0;
    for &id in &report.task_ids {
        let task = store.get(id).await.unwrap().unwrap();
        let attempts = store.attempts(id).await.unwrap();
        let task_calls = calls_by_task.remove(&id).unwrap_or_default();

        // Provider calls <= attempts <= max attempts, and one call per attempt at most.
        assert!(
            task.attempts() <= max_attempts,
            "{id}: {} attempts",
            task.attempts()
        );
        assert_eq!(
            attempts.len() as u32,
            task.attempts(),
            "{id}: one attempt record per claim"
        );
        assert!(task_calls.len() as u32 <= task.attempts(), "{id}: {task_calls:?}");
        let mut numbers: Vec<u32> = task_calls.iter().map(|c| c.attempt).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(
            numbers.len(),
            task_calls.len(),
            "{id}: an attempt called the provider twice"
        );

        match task.status {
            Status::Completed => {
                let saved = attempts
                    .iter()
                    .filter(|a| a.outcome == AttemptOutcome::Completed)
                    .collect::<Vec<_>>();
                assert_eq!(saved.len(), 1, "{id}: exactly one attempt saved a response");
                let winner = saved[0].number;
                // The saved response is the answer the provider gave that attempt.
                let answer = task_calls
                    .iter()
                    .find(|c| c.attempt == winner && c.outcome == CallOutcome::Answered)
                    .and_then(|c| c.answer.clone())
                    .unwrap_or_else(|| panic!("{id}: saved attempt {winner} has no answered call"));
                assert_eq!(
                    task.response.as_ref().and_then(|r| r.as_str()),
                    Some(answer.as_str())
                );
                // Once completed, the task never reached the provider again.
                assert!(
                    task_calls.iter().all(|c| c.attempt <= winner),
                    "{id}: provider called after the save: {task_calls:?}"
                );
                // No two deliveries both believed they saved it. (A worker killed right
                // after its save never reports, so "at most one" is what can be counted here;
                // "exactly one" is the attempt record above.)
                assert!(
                    saved_by_task.get(&id).copied().unwrap_or(0) <= 1,
                    "{id}: saved twice"
                );
                if task_calls
                    .iter()
                    .any(|c| c.outcome == CallOutcome::AnsweredThenCrashed)
                {
                    recovered_after_kill += 1;
                }
            }
            Status::Failed => {
                assert!(task.response.is_none());
                assert!(task.last_error.is_some(), "{id}: a terminal failure says why");
                assert_eq!(saved_by_task.get(&id), None);
                // And it was earned: the budget was spent (lost leases and
                // takeovers count), or the provider refused for good. (With
                // no deadline and ambiguous answers retried, nothing else
                // ends a task.)
                let last = attempts.last().map(|a| &a.outcome);
                assert!(
                    task.attempts() == max_attempts
                        || last == Some(&AttemptOutcome::Failed(FailureKind::Permanent)),
                    "{id}: failed with {} of {max_attempts} attempts, the last {last:?}",
                    task.attempts()
                );
            }
            other => panic!("{id} ended {other}, not terminal\n{report}"),
        }
    }
    assert!(
        calls_by_task.is_empty(),
        "calls for unknown tasks: {calls_by_task:?}"
    );

    // The run exercised what it claims to.
    // (How many complete is the machine's to decide: on a starved one,
    // leases run out and budgets are spent. Each failure was checked above.)
    assert_eq!(report.completed + report.failed, scenario.tasks as u64);
    assert!(report.completed >= 1, "no task completed\n{report}");
    // Every handoff was sent twice (the send whose answer was lost, and its retry).
    assert_eq!(report.published, 2 * scenario.tasks as u64, "{report}");
    assert!(report.deliveries >= report.published, "{report}");
    assert!(
        report.kills >= 1,
        "no worker was killed after an answer\n{report}"
    );
    // A task whose answer died with its worker was taken over and saved by a later attempt.
    assert!(recovered_after_kill >= 1, "{report}");
    assert!(
        report.provider_calls.get("transient").copied().unwrap_or(0) >= 1,
        "{report}"
    );
    // A worker that stalled past its lease came back with its answer and was refused.
    let stalled = report
        .provider_calls
        .get("answered_then_stalled")
        .copied()
        .unwrap_or(0);
    assert!(stalled >= 1, "no worker stalled\n{report}");
    // (Refused as superseded or expired, or as already completed when the takeover
    // saved first: which one depends on timing; both leave the saved response alone.)
    assert!(report.rejections() >= 1, "no late save was refused\n{report}");
    assert!(
        report
            .dispositions
            .get("ack.already_completed")
            .copied()
            .unwrap_or(0)
            >= 1,
        "duplicate deliveries of done tasks were acknowledged without work\n{report}"
    );
    // The visibility extensions ran: each renewal of a lease hides its
    // message for another lease. How many messages still came back while
    // their task was being worked on (`redelivered in flight` in the report)
    // depends on how fast the store and SQS answer on this machine, so it is
    // printed, not asserted: such a delivery is at-least-once delivery doing
    // its job, its claim answers busy, and the checks above show it never
    // cost a second provider call or a second saved response.
    assert!(
        report.extensions >= 1,
        "no visibility extension was made\n{report}"
    );

    queue.delete_queue().await.expect("delete the queue");
    report
}
