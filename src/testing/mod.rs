//! The backend conformance suite: the same scenarios against any [`TaskStore`],
//! so every backend, ours and third parties', proves the same guarantees; a
//! model-based test; and the test kit every backend's tests share.
//!
//! A backend provides a [`Fixture`]: a fresh, isolated store, a way to move
//! the store's clock forward, and a count of persisted records (to check that
//! refused input wrote nothing). Then one macro call generates one
//! `#[tokio::test]` per scenario:
//!
//! ```
//! // tests/conformance.rs of a backend crate (needs tokio with "macros" and "rt-multi-thread")
//! taskfence::testing::conformance_suite!(async { taskfence::testing::MemoryFixture::new() });
//! # fn main() {}
//! ```
//!
//! | item | what it is for |
//! | --- | --- |
//! | [`conformance_suite!`], [`inspection_suite!`], [`dispatch_suite!`], [`rollback_suite!`] | one test per scenario of [`scenarios`] |
//! | [`model_suite!`] | random interleavings checked against the reference [`model`], plus its kept counterexamples |
//! | [`new_task`], [`task_in`], [`prompt_retry`], [`forged_lease`], [`acquire`], [`fail_accepted`], [`one_winner`], [`race`], [`runtime`] | the test kit |
//! | [`MemoryFixture`], `PgFixture`, `PgTxFixture` (the store on one open transaction), `TempSchema`, `SqliteFixture`, `DynamoFixture` | fixtures of this crate's backends |
//! | [`Fixture`], [`InspectFixture`], [`OutboxFixture`], [`FencedWritesFixture`], [`RollbackFixture`] | what a backend gives each suite: a store, its queries, its outbox, the application's fenced writes, claims rolled back in the caller's transaction |
//!
//! The expression is a future, evaluated once per test, that yields a value
//! implementing [`Fixture`] (so a backend can create a database or schema). Each scenario panics with a message naming
//! the broken guarantee.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::ManualClock;
use crate::dispatch::Outbox;
use crate::inspect::Inspect;
use crate::memory::MemoryStore;
use crate::store::{Claim, ClaimRequest, Fenced, Lease, TaskStore};
use crate::task::TaskId;

pub mod chaos;
#[cfg(feature = "dynamodb")]
mod dynamodb;
mod kit;
pub mod model;
#[cfg(feature = "postgres")]
mod postgres;
pub mod scenarios;
#[cfg(feature = "sqlite")]
mod sqlite;
pub mod trace;

pub use crate::__conformance_suite as conformance_suite;
pub use crate::__dispatch_suite as dispatch_suite;
pub use crate::__inspection_suite as inspection_suite;
pub use crate::__limits_suite as limits_suite;
pub use crate::__model_suite as model_suite;
pub use crate::__rollback_suite as rollback_suite;
pub use kit::{
    LEASE, OPERATION, SCOPE, Won, acquire, fail_accepted, forged_lease, key, new_task, one_winner,
    prompt_retry, request, runtime, task_in,
};

#[doc(hidden)]
pub use proptest as __proptest;

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use dynamodb::DynamoFixture;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgFixture, PgTxFixture, TempSchema};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::SqliteFixture;

/// What a backend gives the conformance suite.
///
/// ```
/// use taskfence::testing::{Fixture, MemoryFixture};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let f = MemoryFixture::new();
/// assert_eq!(f.record_count().await, 0);
/// # }
/// ```
#[async_trait]
pub trait Fixture: Send + Sync {
    /// The store under test: fresh, empty, isolated from every other fixture.
    fn store(&self) -> Arc<dyn TaskStore>;

    /// Moves the *store's* clock forward by at least `by` (a manual clock, a
    /// server-side offset, or, for a backend that cannot, a real sleep).
    async fn advance(&self, by: Duration);

    /// How many records the store holds (tasks, attempts, keys, handoffs…):
    /// the suite checks it is unchanged after refused input.
    async fn record_count(&self) -> u64;
}

/// A [`Fixture`] for [`MemoryStore`] on a [`ManualClock`].
///
/// ```
/// let f = taskfence::testing::MemoryFixture::new();
/// let _store = f.memory_store();
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture {
    store: MemoryStore,
    clock: ManualClock,
    /// The application's own rows, for [`FencedWritesFixture`].
    rows: Arc<std::sync::Mutex<Vec<String>>>,
}

impl MemoryFixture {
    /// A fresh store on a manual clock standing at the current time.
    pub fn new() -> Self {
        let clock = ManualClock::default();
        Self {
            store: MemoryStore::with_clock(clock.clone()),
            clock,
            rows: Arc::default(),
        }
    }

    /// The concrete store.
    pub fn memory_store(&self) -> &MemoryStore {
        &self.store
    }

    /// The clock the store runs on.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

#[async_trait]
impl Fixture for MemoryFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(self.store.clone())
    }

    async fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    async fn record_count(&self) -> u64 {
        self.store.record_count()
    }
}

/// Generates one `#[tokio::test]` per conformance scenario; the argument is a
/// future yielding a fresh [`Fixture`], evaluated once per test.
///
/// ```
/// taskfence::testing::conformance_suite!(async { taskfence::testing::MemoryFixture::new() });
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_suite {
    ($fixture:expr) => {
        $crate::__conformance_scenarios!($crate::__conformance_suite { @tests $fixture; });
    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let fixture = $fixture.await;
                $crate::testing::scenarios::$name(&fixture).await;
            }
        )*
    };
}

/// Calls the macro `$callback` with `$prefix` followed by the name of every
/// conformance scenario, so each list of them (the suite's tests, a trace
/// recording's runs) is this one.
///
/// ```
/// macro_rules! count { ($($name:ident),* $(,)?) => { const N: usize = [$(stringify!($name)),*].len(); }; }
/// taskfence::__conformance_scenarios!(count {});
/// assert!(N > 60);
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_scenarios {
    ($callback:path { $($prefix:tt)* }) => {
        $callback! { $($prefix)*
            duplicate_submit_returns_same_task,
            key_reuse_with_other_inputs_conflicts_and_writes_nothing,
            same_key_in_another_scope_or_operation_is_independent,
            regenerate_with_new_key_is_new_work,
            concurrent_duplicate_submits_create_one_task,
            concurrent_claims_acquire_once,
            claim_of_completed_task_returns_saved_response_without_attempt,
            superseded_lease_is_rejected_everywhere,
            complete_after_lease_expiry_is_rejected,
            paused_worker_after_takeover_is_rejected,
            double_complete_keeps_first_response,
            concurrent_completes_accept_once,
            attempts_counted_at_claim_including_takeover,
            max_attempts_exhausted_is_terminal,
            deadline_exhausted_is_terminal,
            claim_during_backoff_waits,
            permanent_and_ambiguous_failures_follow_policy,
            requested_retry_delay_replaces_the_backoff_within_the_budget,
            unstarted_releases_cost_no_attempt,
            crash_after_claim_still_counts,
            stale_unstarted_release_is_refused_and_refunds_nothing,
            renew_keeps_lease_alive_and_fails_after_takeover,
            release_gives_task_back_and_keeps_attempt,
            cancel_stops_running_worker,
            record_operation_is_visible_in_attempts,
            due_lists_expired_leases_and_passed_backoffs,
            expired_leases_are_republished_live_ones_are_not,
            republished_tasks_carry_their_id_and_version,
            purge_removes_only_expired_records,
            unknown_task_is_not_found,
            strings_are_stored_verbatim,
            trace_context_is_stored_with_the_task,
            scopes_are_isolated,
            bad_input_is_rejected_and_writes_nothing,
            acceptance_rule_is_stored_with_the_task,
            first_valid_answer_saves_paused_worker_after_takeover,
            first_valid_answer_still_fences_everything_but_completion,
            first_valid_answer_never_saves_terminal_tasks_or_ungranted_leases,
            first_valid_answer_racing_completions_save_once,
            submit_many_answers_each_task_as_submit_would,
            submit_many_decides_a_repeated_key_in_input_order,
            bad_submit_many_batches_are_refused_and_write_nothing,
            claim_many_answers_each_task_as_claim_would,
            claim_many_exhausts_and_takes_over_as_claim_would,
            complete_many_fences_each_lease_on_its_own,
            racing_batches_claim_and_complete_each_task_once,
            bad_batches_are_refused_and_write_nothing,
            reopen_gives_failed_task_a_fresh_budget,
            reopen_gives_new_policy_and_fresh_deadline,
            reopen_refuses_completed_live_and_unknown_tasks,
            reopen_of_cancelled_task_keeps_old_leases_fenced,
            bad_reopen_requests_are_refused_and_write_nothing,
            reopen_restarts_exactly_the_configured_retention,
            reopen_can_change_only_max_attempts,
            every_attempt_gets_the_same_effect_key,
            a_done_effect_is_skipped_by_later_attempts,
            an_intent_without_outcome_is_retried_under_the_retry_policy,
            an_intent_without_outcome_stops_under_the_stop_policy,
            only_a_current_lease_records_an_effect,
            bad_effect_calls_are_refused_and_write_nothing,
            effects_are_purged_with_their_task,
            killed_workers_cause_no_silent_duplicate_effects,
            claim_next_hands_out_due_tasks_oldest_first,
            limits_are_kept_or_refused_never_ignored,
            claim_next_skips_tasks_that_need_no_worker,
            claim_next_fails_a_spent_budget_instead,
            claim_next_takes_only_the_operations_and_scopes_asked_for,
            released_task_is_due_and_handed_out_again,
            concurrent_claim_next_hands_each_task_out_once,
            renew_many_fences_each_lease_on_its_own,
            bad_claim_next_and_renew_many_are_refused_and_write_nothing,
        }
    };
}

/// A [`Fixture`] whose store also answers [`Inspect`]: what the
/// [`inspection_suite!`] needs.
///
/// ```
/// use taskfence::testing::{InspectFixture, MemoryFixture};
/// let _inspector = MemoryFixture::new().inspector();
/// ```
pub trait InspectFixture: Fixture {
    /// The same store as [`Fixture::store`], as an [`Inspect`].
    fn inspector(&self) -> Arc<dyn Inspect>;
}

impl InspectFixture for MemoryFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        Arc::new(self.store.clone())
    }
}

/// A [`Fixture`] that can make the application's own write under the
/// store's fence: one row written in one transaction with the backend's
/// lease check (`PgStore::on(&mut tx).fence`, DynamoDB's fence item,
/// [`MemoryStore::fenced_write`]), for
/// [`own_writes_commit_only_under_a_current_lease`](scenarios::own_writes_commit_only_under_a_current_lease).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use taskfence::testing::{FencedWritesFixture, MemoryFixture};
/// assert!(MemoryFixture::new().rows().await.is_empty());
/// # }
/// ```
#[async_trait]
pub trait FencedWritesFixture: Fixture {
    /// Writes the application row `row` together with the fence of
    /// `lease`: the row is committed only if the fence accepts.
    async fn write_fenced(&self, lease: &Lease, row: &str) -> crate::Result<Fenced<()>>;

    /// The application rows committed so far.
    async fn rows(&self) -> Vec<String>;
}

#[async_trait]
impl FencedWritesFixture for MemoryFixture {
    async fn write_fenced(&self, lease: &Lease, row: &str) -> crate::Result<Fenced<()>> {
        self.store
            .fenced_write(lease, || self.rows.lock().expect("rows").push(row.to_owned()))
    }

    async fn rows(&self) -> Vec<String> {
        self.rows.lock().expect("rows").clone()
    }
}

/// A [`Fixture`] whose store lets the caller claim inside a transaction of
/// its own (`PgStore::on(&mut tx)`, `SqliteStore::on(&mut tx)`, a savepoint
/// of [`PgTxFixture`]'s transaction) and roll it back: the task is as before
/// the claim, yet the claim's lease exists. What
/// [`lease_of_a_rolled_back_claim_is_refused_everywhere`](scenarios::lease_of_a_rolled_back_claim_is_refused_everywhere)
/// needs. A store whose claims cannot be undone after they answer (memory,
/// DynamoDB) has nothing to implement.
///
/// ```no_run
/// # async fn f(fixture: impl taskfence::testing::RollbackFixture, id: taskfence::TaskId) {
/// use taskfence::testing::{request, RollbackFixture};
/// let undone = fixture.claim_rolled_back(id, request("w")).await;
/// assert!(undone.is_acquired(), "the claim answered, then its transaction rolled back");
/// # }
/// ```
#[async_trait]
pub trait RollbackFixture: Fixture {
    /// Claims `id` in a transaction on the store's transaction handle, then
    /// rolls that transaction back; returns what the claim answered.
    async fn claim_rolled_back(&self, id: TaskId, request: ClaimRequest) -> Claim;

    /// The store's own fence of `lease` in a transaction on its transaction
    /// handle (`fence` of `on(&mut tx)`), then rolled back.
    async fn fence_in_transaction(&self, lease: &Lease) -> crate::Result<Fenced<()>>;
}

/// Generates one `#[tokio::test]` per scenario of a claim rolled back in
/// the caller's transaction; the argument is a future yielding a fresh
/// [`RollbackFixture`], evaluated once per test.
///
/// ```no_run
/// taskfence::testing::rollback_suite!(taskfence::testing::SqliteFixture::new());
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __rollback_suite {
    ($fixture:expr) => {
        $crate::__conformance_suite!(@tests $fixture;
            lease_of_a_rolled_back_claim_is_refused_everywhere,
            first_valid_answer_never_saves_a_rolled_back_claim,
        );
    };
}

/// Generates one `#[tokio::test]` per [`Inspect`] scenario (listings,
/// counts, stories, stranded tasks); the argument is a future yielding a
/// fresh [`InspectFixture`], evaluated once per test.
///
/// ```
/// taskfence::testing::inspection_suite!(async { taskfence::testing::MemoryFixture::new() });
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __inspection_suite {
    ($fixture:expr) => {
        $crate::__conformance_suite!(@tests $fixture;
            list_filters_orders_and_pages,
            list_filters_by_age,
            counts_by_status_and_scope,
            story_tells_attempts_and_reopenings,
            stranded_lists_unclaimed_pending_tasks,
            stranded_counts_from_the_latest_reopening,
            every_task_needing_a_worker_is_found,
            depth_counts_each_operations_queue,
            bad_queries_are_refused,
            list_rows_are_summaries_without_payload_or_response,
            counts_up_to_stop_at_the_cap,
        );
    };
}

/// Generates one `#[tokio::test]` per limits scenario
/// ([`scenarios::limits`]: concurrency keys and rate buckets) for a store
/// that [decides limits](crate::backend::Backend::decides_limits); the
/// argument is a future yielding a fresh [`InspectFixture`], evaluated once
/// per test.
///
/// ```no_run
/// // tests/limits.rs of a backend
/// taskfence::testing::limits_suite!(async { taskfence::testing::MemoryFixture::new() });
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __limits_suite {
    ($fixture:expr) => {
        $crate::__conformance_suite!(@tests $fixture;
            a_concurrency_key_never_runs_more_than_its_limit,
            a_slot_comes_back_when_its_lease_expires,
            a_superseded_worker_frees_no_slot,
            an_in_order_key_runs_in_submission_order_through_a_retry,
            a_reopened_task_goes_before_its_keys_younger_tasks,
            claim_next_is_fair_across_keys,
            a_rate_bucket_gives_its_burst_then_its_rate,
            a_drained_bucket_stops_every_worker_until_retry_after,
            bad_limits_are_refused_and_write_nothing,
        );
    };
}

/// A [`Fixture`] whose store has a transactional outbox (an
/// [`Outbox`]): what the [`dispatch_suite!`] needs. A store without one
/// (such as [`MemoryStore`]) has no dispatch scenarios to pass.
///
/// ```no_run
/// # async fn f(fixture: impl taskfence::testing::OutboxFixture) {
/// use taskfence::testing::OutboxFixture;
/// assert_eq!(fixture.handoff_count().await, 0);
/// # }
/// ```
#[async_trait]
pub trait OutboxFixture: InspectFixture {
    /// The store's own type: the dispatcher runs on it, and a scenario may
    /// move a clone of it into a task of its own.
    type Store: Outbox + TaskStore + Inspect + Clone + 'static;

    /// The same store as [`Fixture::store`], as its own type.
    fn outbox(&self) -> Self::Store;

    /// How many handoffs the store holds, published or not.
    async fn handoff_count(&self) -> u64;
}

/// Generates one `#[tokio::test]` per dispatch scenario (the outbox:
/// [`scenarios::dispatch`]); the argument is a future yielding a fresh
/// [`OutboxFixture`], evaluated once per test.
///
/// ```no_run
/// // tests/dispatch.rs of a backend with an outbox
/// # #[cfg(feature = "postgres")]
/// taskfence::testing::dispatch_suite!(taskfence::testing::PgFixture::new());
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __dispatch_suite {
    ($fixture:expr) => {
        $crate::__conformance_suite!(@tests $fixture;
            submitted_tasks_are_published_once_in_order_and_marked,
            crash_between_publish_and_mark_republishes_the_same_task,
            a_failed_publish_stops_the_round_and_stays_pending,
            batches_publish_a_round_in_chunks_and_a_failed_batch_stays_pending_whole,
            tasks_without_a_handoff_get_none_and_share_the_store_with_broker_tasks,
            messages_are_stamped_with_the_task_id_and_version,
            redispatch_hands_pending_tasks_to_the_dispatcher_again,
            purge_deletes_the_handoffs_with_their_task,
        );
    };
}

/// Runs `n` copies of a future at once on the tokio runtime, released together
/// by a barrier, and collects their outputs in order: the race the
/// concurrency scenarios (and backends' own race tests) are made of.
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)] async fn main() {
/// let squares = taskfence::testing::race(4, |i| async move { i * i }).await;
/// assert_eq!(squares, [0, 1, 4, 9]);
/// # }
/// ```
pub async fn race<T, Fut>(n: usize, make: impl Fn(usize) -> Fut) -> Vec<T>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, fut) = (barrier.clone(), make(i));
            tokio::spawn(async move {
                barrier.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.push(h.await.expect("racer panicked"));
    }
    out
}

/// Generates the model-based test of a backend: a property test that runs
/// random interleavings of every operation across several workers
/// ([`model::ops`]) against a fresh fixture and the reference [`model`],
/// comparing them after every step, plus one `#[test]` per counterexample
/// kept in [`model::regressions`]. The first argument is a future yielding a
/// fresh [`Fixture`] (evaluated once per case, on [`runtime`]); `cases` and
/// `steps` (the longest interleaving) are optional, 256 and 40 by default.
///
/// ```
/// taskfence::testing::model_suite!(async { taskfence::testing::MemoryFixture::new() }, cases = 16, steps = 20);
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! __model_suite {
    ($fixture:expr $(, cases = $cases:expr)? $(, steps = $steps:expr)? $(,)?) => {
        $crate::testing::__proptest::proptest! {
            #![proptest_config($crate::testing::__proptest::prelude::ProptestConfig {
                cases: { let _cases = 256; $(let _cases = $cases;)? _cases },
                ..$crate::testing::__proptest::prelude::ProptestConfig::default()
            })]

            #[test]
            fn store_agrees_with_the_model(
                ops in $crate::testing::model::ops({ let _steps = 40; $(let _steps = $steps;)? _steps })
            ) {
                $crate::testing::model::check(|| $fixture, &ops);
            }
        }

        #[test]
        fn claim_after_spent_budget_is_failed() {
            $crate::testing::model::check(
                || $fixture,
                &$crate::testing::model::regressions::claim_after_spent_budget_is_failed(),
            );
        }

        #[test]
        fn claim_of_completed_task_answers_completed() {
            $crate::testing::model::check(
                || $fixture,
                &$crate::testing::model::regressions::claim_of_completed_task_answers_completed(),
            );
        }
    };
}
