//! [`ReadGate`]: how many of the store reads behind a page may run at once.
//! A page beyond that is answered at once — 503 with `Retry-After` — rather
//! than queued, so a burst of requests cannot pile work onto the store.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::PageError;

/// Pages whose store reads may run at once, by default.
pub(crate) const DEFAULT_CONCURRENT_READS: usize = 8;

/// The seconds a refused page asks the client to wait (`Retry-After`).
pub(crate) const RETRY_AFTER_SECS: u32 = 1;

/// The permits of the pages that read the store.
#[derive(Debug, Clone)]
pub(crate) struct ReadGate {
    permits: Arc<Semaphore>,
}

impl ReadGate {
    /// At most `n` (at least one) pages reading at once.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(n.max(1))),
        }
    }

    /// A permit for one page's reads, held until the page is answered, or
    /// [`PageError::Busy`] when every permit is taken.
    pub(crate) fn enter(&self) -> Result<OwnedSemaphorePermit, PageError> {
        self.permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| PageError::Busy)
    }
}
