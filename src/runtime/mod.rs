//! The worker runtime, at two levels:
//!
//! - [`Consumer`] is the whole worker loop: it fetches from a [`Source`]
//!   (the store itself, [`StoreQueue`], or a broker whose messages name task
//!   ids), runs the work function with a concurrency limit, renews what it
//!   holds in one request, group-commits completions and stops within a
//!   bound (see its docs and `examples/pg-worker`).
//! - [`Worker`] handles one delivery, for an adapter that keeps its own loop:
//!   give it a task id from any queue message, it runs the whole protocol
//!   and tells the adapter what to do with the message. The consumer runs
//!   each task by the same steps.
//!
//! A queue delivers "go work on task X" at least once; [`Worker::handle`] makes
//! every delivery safe:
//!
//! 1. **Claim.** A completed, failed or cancelled task is acknowledged without
//!    calling the work function (guarantee 6: done means done). A task held by
//!    a live lease, or waiting out a backoff, is retried after that wait.
//! 2. **Keep the lease alive.** While the work runs, a background loop renews
//!    the lease every [`WorkerConfig::renew_every`] (a third of the lease by
//!    default, so one slow renewal never lets it lapse) and calls
//!    [`LeaseHooks::on_renewed`], where the adapter extends its *own* message
//!    timer (an SQS visibility timeout, say). The two timers are different
//!    things: the lease is the right to work on the task, the message timer
//!    only hides the message from other consumers.
//! 3. **Signal loss.** If a renewal is refused (another worker took over after
//!    a pause, the task was cancelled…) or the store stays unreachable past the
//!    lease's expiry, [`WorkContext::lease_lost`] resolves; the work function
//!    should stop. After [`WorkerConfig::stop_grace`] the runtime drops it.
//! 4. **Complete or fail.** A response is saved by one fenced write; a failure
//!    goes to the task's [`RetryPolicy`](crate::RetryPolicy), stored with the
//!    task so a redelivery never resets the budget.
//!
//! The answer is one [`Disposition`]: [`Ack`](Disposition::Ack) (delete the
//! message: done, or terminal), [`RetryAfter`](Disposition::RetryAfter) (make
//! the message visible again after the delay: backoff, or another live lease),
//! or [`Leave`](Disposition::Leave) (do nothing: the lease was lost, the
//! message timer will bring the message back and the next claim decides).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use taskfence::runtime::{AckReason, Disposition, Worker, WorkerConfig};
//! use taskfence::*;
//!
//! let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
//! let task = store
//!     .submit(NewTask::new(RequestKey::new("user-1", "chat.reply", "req-1"), InputHash::of(["msg-1"])))
//!     .await?
//!     .into_task();
//! let worker = Worker::new(store, WorkerConfig::new("worker-a", Duration::from_secs(30)))?;
//!
//! // The queue adapter parsed `task.id` out of a message.
//! let disposition = worker
//!     .handle(task.id, &(), |ctx| async move {
//!         // call the provider here; stop early if `ctx.lease_lost()` resolves
//!         let _payload = ctx.task().payload.clone();
//!         Ok(Response::from("the one saved reply"))
//!     })
//!     .await?;
//! assert_eq!(disposition, Disposition::Ack(AckReason::Completed));
//!
//! // The same message delivered again: acknowledged, the work is not called.
//! let again = worker.handle(task.id, &(), |_ctx| async { unreachable!("done means done") }).await?;
//! assert_eq!(again, Disposition::Ack(AckReason::AlreadyCompleted));
//! # Ok(()) }
//! ```
//!
//! | module | what it holds |
//! | --- | --- |
//! | `disposition` | [`Disposition`] and its reasons: what the adapter does with the message |
//! | `hooks` | [`LeaseHooks`]: the adapter's callbacks when a lease is granted or extended |
//! | `config` | [`WorkerConfig`]: how a [`Worker`] claims and keeps its leases |
//! | `worker` | [`Worker`]: one delivery through the task protocol |
//! | `context` | [`WorkContext`]: what the work function gets |
//! | `consumer` | [`Consumer`], [`ConsumerConfig`], [`Stopped`]: the whole worker loop |
//! | `source` | [`Source`], [`StoreQueue`], [`Delivery`], [`Wake`]: where a consumer's work comes from |
//! | `stop` | [`Stop`]: the consumer's stop switch |
//! | `failure` | a work function's failure or panic made fit to report |
//! | `held` | the leases a consumer holds and their renewal rounds |
//! | `commit` | the consumer's group commit of completions |

mod commit;
mod config;
mod consumer;
mod context;
mod disposition;
mod failure;
mod held;
mod hooks;
mod purge;
mod saved;
mod source;
mod stop;
mod worker;

pub use config::WorkerConfig;
pub use consumer::{Consumer, ConsumerConfig, Stopped};
pub use context::WorkContext;
pub use disposition::{AckReason, Disposition, LeaveReason, RetryReason};
pub use hooks::LeaseHooks;
pub use purge::{purge_every, purge_expired_all, spawn_purge};
pub use saved::{SavedEvents, SavedWaiter};
pub use source::{Delivery, Source, StoreQueue, Wake};
pub use stop::Stop;
pub use worker::Worker;
