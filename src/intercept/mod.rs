//! [`Intercepted`]: a store that passes every call through to another store,
//! except the calls an [`Intercept`] chooses to handle itself, and lets it
//! observe every call.
//!
//! Why: wrapping a store is how an application adds behaviour around the
//! contract without a backend of its own — writing its reply rows in the
//! completion's transaction, moving a consumer position with it, counting
//! calls — and how a test injects a fault (stall a renewal, lose a reply,
//! accept what the real store would refuse). Implement only the methods you
//! change; every other one forwards, so a method added to [`TaskStore`] later
//! forwards too instead of breaking (or silently skipping) every wrapper.
//!
//! Two kinds of hook:
//!
//! - **One per operation** ([`Intercept::complete`], [`Intercept::claim`]…),
//!   each forwarding to the wrapped store by default: override one to change
//!   what that operation does.
//! - **[`Intercept::around`]**, called around every operation with a
//!   description of the call ([`Call`]) and, once it finishes, its answer
//!   described the same way for every operation ([`Outcome`]): the place for
//!   what applies to all of them alike (metrics, spans, an audit log).
//!   `taskfence::metrics` is built on it.
//!
//! The wrapped store keeps its type (`Intercepted<PgStore, _>` still reaches
//! its `PgStore`), and [`Inspect`] is forwarded too when the wrapped store
//! answers it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use taskfence::intercept::{Intercept, Intercepted};
//! use taskfence::*;
//!
//! /// Counts completions; everything else passes through untouched.
//! #[derive(Default)]
//! struct CountCompletions(AtomicU64);
//!
//! #[async_trait::async_trait]
//! impl Intercept for CountCompletions {
//!     async fn complete(&self, inner: &dyn TaskStore, lease: Lease, response: Response) -> Result<Fenced<Task>> {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         inner.complete(lease, response).await
//!     }
//! }
//!
//! let store = Intercepted::new(Arc::new(MemoryStore::new()), CountCompletions::default());
//! let task = store
//!     .submit(NewTask::new(RequestKey::new("u", "op", "k"), InputHash::of(["x"])))
//!     .await?
//!     .into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w", Duration::from_secs(30))).await? else {
//!     unreachable!()
//! };
//! store.complete(lease, Response::from("hi")).await?;
//! assert_eq!(store.interceptor().0.load(Ordering::Relaxed), 1);
//! # Ok(()) }
//! ```
//!
//! | module | what it holds |
//! | --- | --- |
//! | `hook` | [`Intercept`], the hooks, and [`Pending`], the call's future they receive |
//! | `call` | [`Call`]: what a call names |
//! | `outcome` | [`Outcome`]: an answer described alike for every operation |
//! | `inner` | [`Inner`], [`InnerInspect`]: the stores [`Intercepted`] can wrap |
//! | `forward` | [`Intercepted`]: the wrapper, forwarding every call through the hooks |

#[cfg(doc)]
use crate::inspect::Inspect;
#[cfg(doc)]
use crate::store::TaskStore;

mod call;
mod forward;
mod hook;
mod inner;
mod outcome;

pub use call::Call;
pub use forward::Intercepted;
pub use hook::{Intercept, Pending};
pub use inner::{Inner, InnerInspect};
pub use outcome::Outcome;
