//! The consumer (`taskfence::runtime::Consumer`) on `MemoryStore`, on
//! `PgStore` and on `SqliteStore`, in real time: every scenario in
//! `scenarios` runs on each.

#[path = "../common/mod.rs"]
mod common;

mod notify;
mod scenarios;

/// A fresh store of each backend: what keeps it alive, and the store.
mod backends {
    use std::sync::Arc;

    use taskfence::{MemoryStore, TaskStore};

    pub(crate) async fn memory() -> (Box<dyn std::any::Any + Send>, Arc<dyn TaskStore>) {
        (Box::new(()), Arc::new(MemoryStore::new()))
    }

    pub(crate) async fn postgres() -> (Box<dyn std::any::Any + Send>, Arc<dyn TaskStore>) {
        let f = crate::common::fixture().await;
        let store: Arc<dyn TaskStore> = Arc::new(f.pg_store().clone());
        (Box::new(f), store)
    }

    /// A fresh file, the store on the system clock (the consumer runs in real time).
    pub(crate) async fn sqlite() -> (Box<dyn std::any::Any + Send>, Arc<dyn TaskStore>) {
        let f = taskfence::testing::SqliteFixture::new().await;
        let store = taskfence::SqliteStore::open(f.path())
            .await
            .expect("open the file");
        (Box::new(f), Arc::new(store))
    }
}

macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let (_keep, store) = crate::backends::memory().await;
                    crate::scenarios::$name(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let (_keep, store) = crate::backends::postgres().await;
                    crate::scenarios::$name(store).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let (_keep, store) = crate::backends::sqlite().await;
                    crate::scenarios::$name(store).await;
                }
            )*
        }
    };
}

on_every_backend!(
    drains_a_queue_saving_one_response_each_in_group_commits,
    held_leases_are_renewed_together_and_outlive_their_length,
    a_panicking_work_function_is_a_failure_within_the_budget,
    a_work_closure_that_panics_before_its_future_is_a_failure_within_the_budget,
    a_renewal_slower_than_its_period_still_keeps_the_lease,
    a_requested_retry_delay_replaces_the_backoff,
    a_stop_lets_running_work_finish_and_fetches_no_more,
    work_past_the_grace_is_released_for_another_process,
    a_second_stop_request_releases_at_once,
    a_claim_on_its_way_at_the_stop_is_given_back,
    a_store_that_stops_answering_never_holds_the_stop_past_its_deadline,
    a_lost_lease_stops_the_work_and_saves_nothing,
    broker_deliveries_are_claimed_together_and_settled_after_the_store,
    a_submission_wakes_an_idle_consumer,
    a_fetch_that_drains_the_store_waits_before_the_next,
    a_dropped_consumer_stops_renewing_its_leases,
    a_deploy_loop_spends_no_budget_on_prefetched_tasks,
);
