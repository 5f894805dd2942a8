//! The conformance scenarios, one public function each, named after what
//! they check, grouped by the guarantee they protect: when one fails, its
//! module says what is broken. [`conformance_suite!`](crate::testing::conformance_suite)
//! runs them all; a backend may also call one directly.
//!
//! | module | guarantee |
//! | --- | --- |
//! | [`dedup`] | Guarantees 2, 3 and 4: a request key names one piece of work, bound to its inputs, within its scope. |
//! | [`claim`] | Guarantees 6 and 1 (claim side): who may work on a task now, and done means done. |
//! | [`fencing`] | Guarantees 1, 5 and 8: only the current, live assignment may write, and one response is saved. |
//! | [`budget`] | Guarantee 7: the retry budget (attempts, deadline, backoff, failure kinds) lives with the task. |
//! | [`lifecycle`] | The rest of a task's life: release, cancel, operation ids, unknown ids, stored text. |
//! | [`maintenance`] | Guarantee 10 and republishing: `due`, `republish_due` and `purge_expired`. |
//! | [`bad_input`] | Guarantee 11: bad input gets a typed error and writes nothing. |
//! | [`acceptance`] | Guarantees 1 and 5 under each acceptance rule, stored with the task. |
//! | [`batch`] | Batches decide each task as the single operation would. |
//! | [`next`] | The store as the queue: `claim_next` hands each task that needs a worker to one caller, oldest first; `renew_many`. |
//! | [`reopen`] | An operator's reopening: a fresh budget, old leases still fenced. |
//! | [`effects`] | Effects beyond the response: the effect journal (one key per effect, intent and outcome fenced, ambiguity by policy) and the application's own fenced writes. |
//! | [`dispatch`] | Guarantee 9 on a store with an outbox: the dispatcher publishes each handoff at least once, in order, stamped; `redispatch` ([`dispatch_suite!`](crate::testing::dispatch_suite)). |
//! | [`limits`] | Limits across every worker: concurrency keys (slots are leases, limit-1 keys in order), rate buckets, fairness across keys ([`limits_suite!`](crate::testing::limits_suite)). |
//! | [`inspection`] | [`Inspect`](crate::inspect::Inspect): listings, counts, stories, stranded tasks ([`inspection_suite!`](crate::testing::inspection_suite)). |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use taskfence::testing::{scenarios, MemoryFixture};
//! scenarios::double_complete_keeps_first_response(&MemoryFixture::new()).await;
//! # }
//! ```

use std::time::Duration;

use crate::store::{Claim, ClaimRequest, Lease, TaskStore};
use crate::task::{InputHash, NewTask, RequestKey, Task, TaskId};

pub mod acceptance;
pub mod bad_input;
pub mod batch;
pub mod budget;
pub mod claim;
pub mod dedup;
pub mod dispatch;
pub mod effects;
pub mod fencing;
pub mod inspection;
pub mod lifecycle;
pub mod limits;
pub mod maintenance;
pub mod next;
pub mod reopen;

pub use acceptance::*;
pub use bad_input::*;
pub use batch::*;
pub use budget::*;
pub use claim::*;
pub use dedup::*;
pub use dispatch::*;
pub use effects::*;
pub use fencing::*;
pub use inspection::*;
pub use lifecycle::*;
pub use limits::*;
pub use maintenance::*;
pub use next::*;
pub use reopen::*;

pub(crate) use crate::testing::kit::{LEASE, acquire, fail_accepted, key, new_task, request};

/// A little past [`LEASE`].
pub(crate) const PAST_LEASE: Duration = Duration::from_secs(31);
/// Concurrency of the race scenarios.
pub(crate) const RACERS: usize = 32;

pub(crate) async fn submit(store: &dyn TaskStore, task: NewTask) -> Task {
    store.submit(task).await.expect("submit").into_task()
}

pub(crate) async fn task(store: &dyn TaskStore, id: TaskId) -> Task {
    store.get(id).await.expect("get").expect("task exists")
}

/// Asserts that renew, record_operation, fail, release and release_unstarted of `old` are each
/// refused with `Superseded { current_version }`.
pub(crate) async fn assert_superseded_writes(store: &dyn TaskStore, old: &Lease, current_version: u64) {
    use crate::policy::Failure;
    use crate::store::Rejection;
    let superseded = Rejection::Superseded { current_version };
    let mut renewing = old.clone();
    assert_eq!(
        store.renew(&mut renewing, LEASE).await.unwrap().rejection(),
        Some(&superseded),
        "renew"
    );
    assert_eq!(
        store.record_operation(old, "op-1").await.unwrap().rejection(),
        Some(&superseded),
        "record_operation"
    );
    assert_eq!(
        store
            .fail(old.clone(), Failure::retryable("x"))
            .await
            .unwrap()
            .rejection(),
        Some(&superseded),
        "fail"
    );
    assert_eq!(
        store.release(old.clone()).await.unwrap().rejection(),
        Some(&superseded),
        "release"
    );
    assert_eq!(
        store.release_unstarted(old.clone()).await.unwrap().rejection(),
        Some(&superseded),
        "release_unstarted"
    );
}
