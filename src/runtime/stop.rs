//! [`Stop`]: how a [`Consumer`](super::Consumer) is told to stop — first
//! gracefully, then at once.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio::time::Instant;

/// How far a stop has gone. Ordered: each phase includes the ones before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Fetching and working.
    Running,
    /// No more fetching; running work may finish within the grace.
    Draining,
    /// Running work is dropped and its leases released.
    Now,
}

/// The stop switch of a [`Consumer`](super::Consumer): the first request
/// drains (no more fetching; running work finishes within the grace, then
/// what remains is released), a second one releases at once. Cheap to clone;
/// every clone is the same switch.
///
/// ```
/// let stop = taskfence::runtime::Stop::new();
/// assert!(!stop.is_requested());
/// stop.request(); // SIGTERM: drain
/// stop.request(); // a second SIGTERM: release now
/// assert!(stop.is_requested());
/// ```
#[derive(Debug, Clone)]
pub struct Stop {
    phase: Arc<watch::Sender<Phase>>,
    /// When the first stop was asked for: the grace counts from here.
    requested_at: Arc<OnceLock<Instant>>,
}

impl Default for Stop {
    fn default() -> Self {
        Self::new()
    }
}

impl Stop {
    /// A switch not yet pulled.
    pub fn new() -> Self {
        Self {
            phase: Arc::new(watch::Sender::new(Phase::Running)),
            requested_at: Arc::default(),
        }
    }

    /// Escalates: the first call drains, any later one stops at once.
    pub fn request(&self) {
        self.requested_at.get_or_init(Instant::now);
        self.phase.send_modify(|phase| {
            *phase = match phase {
                Phase::Running => Phase::Draining,
                Phase::Draining | Phase::Now => Phase::Now,
            };
        });
    }

    /// Stops fetching; running work may finish within the grace.
    ///
    /// ```
    /// let stop = taskfence::runtime::Stop::new();
    /// stop.drain();
    /// assert!(stop.is_requested());
    /// ```
    pub fn drain(&self) {
        self.requested_at.get_or_init(Instant::now);
        self.phase.send_if_modified(|phase| {
            let was = *phase;
            *phase = (*phase).max(Phase::Draining);
            *phase != was
        });
    }

    /// Drops running work and releases its leases at once.
    ///
    /// ```
    /// let stop = taskfence::runtime::Stop::new();
    /// stop.now();
    /// assert!(stop.is_requested());
    /// ```
    pub fn now(&self) {
        self.requested_at.get_or_init(Instant::now);
        self.phase.send_replace(Phase::Now);
    }

    /// `true` once a stop was asked for.
    pub fn is_requested(&self) -> bool {
        *self.phase.borrow() > Phase::Running
    }

    /// Resolves once a stop is requested (at once if one was): for the rest
    /// of a service (its HTTP server, a sweep) to stop with the consumer.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let stop = taskfence::runtime::Stop::new();
    /// let server_stops = tokio::spawn({
    ///     let stop = stop.clone();
    ///     async move { stop.requested().await }
    /// });
    /// stop.request();
    /// server_stops.await.unwrap();
    /// # }
    /// ```
    pub async fn requested(&self) {
        reached(&mut self.watch(), Phase::Draining).await;
    }

    /// Pulls the switch on each `SIGTERM` or `SIGINT` (Ctrl-C) this process
    /// receives, forever: the first drains, the second stops at once. Spawn
    /// it beside the consumer.
    ///
    /// ```no_run
    /// # async fn f(consumer: taskfence::runtime::Consumer<taskfence::runtime::StoreQueue>) {
    /// tokio::spawn(consumer.stop().clone().on_signals());
    /// # }
    /// ```
    #[cfg(unix)]
    pub async fn on_signals(self) {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            tracing::error!("cannot listen for SIGTERM and SIGINT");
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: stopping"),
                _ = int.recv() => tracing::info!("SIGINT: stopping"),
            }
            self.request();
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    pub(crate) fn watch(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Resolves once a stop was asked for `grace` ago.
    pub(crate) async fn grace_over(&self, grace: std::time::Duration) {
        self.requested().await;
        let since = self.requested_at.get().copied().unwrap_or_else(Instant::now);
        tokio::time::sleep_until(since + grace).await;
    }
}

/// Resolves once `phase` reaches `at_least`.
pub(crate) async fn reached(phase: &mut watch::Receiver<Phase>, at_least: Phase) {
    // The sender lives in the consumer's `Stop`: it outlives every receiver.
    let _ = phase.wait_for(|p| *p >= at_least).await;
}
