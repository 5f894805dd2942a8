//! [`LeaseHooks`]: the adapter's callbacks when a lease is granted and
//! extended, to keep its own message timer in step.

use async_trait::async_trait;

use crate::store::Lease;

/// Callbacks at the moments a lease is granted and extended, so the adapter can
/// keep its own message timer in step (for SQS: `ChangeMessageVisibility`).
///
/// They are awaited inline by the renewal loop: keep them short, and let them
/// log their own errors (a failed extension is not fatal: the worst case is a
/// duplicate delivery, which the claim makes harmless). `()` is the no-op.
///
/// ```
/// use async_trait::async_trait;
/// use taskfence::{runtime::LeaseHooks, Lease};
///
/// struct ExtendVisibility;
///
/// #[async_trait]
/// impl LeaseHooks for ExtendVisibility {
///     async fn on_renewed(&self, lease: &Lease) {
///         println!("keep the message hidden past {}", lease.expires_at());
///     }
/// }
/// ```
#[async_trait]
pub trait LeaseHooks: Send + Sync {
    /// The task was claimed: `lease` is the new assignment, before the work starts.
    async fn on_claimed(&self, _lease: &Lease) {}

    /// The lease was renewed: `lease.expires_at()` is the new expiry (store clock).
    async fn on_renewed(&self, _lease: &Lease) {}
}

/// No hooks.
#[async_trait]
impl LeaseHooks for () {}
