//! [`SavedEvents`]: "this task's result is saved", fanned out to every
//! request of this process waiting for it (a long-poll), from whatever hears
//! it: a PostgreSQL `LISTEN`, a message from the worker, the process's own
//! commit.
//!
//! An announcement is only a hint to read the store again: the store is the
//! truth. An announcement that may have been missed (the listening
//! connection was lost, a waiter fell behind) wakes every waiter.

use tokio::sync::broadcast;

use crate::task::TaskId;

/// What a waiter is woken by.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// This task's result was committed.
    Saved(TaskId),
    /// Announcements may have been missed: read again.
    Resync,
}

/// The announcements of saved results in one process. Cheap to clone; every
/// clone is the same fan-out.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use taskfence::{TaskId, runtime::SavedEvents};
///
/// let events = SavedEvents::new();
/// let task = TaskId::new();
/// // Subscribe, then read the task; still running: wait, then read again.
/// let mut waiter = events.subscribe();
/// events.saved(task); // what the listener does when the commit is heard
/// waiter.changed(task).await;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SavedEvents {
    tx: broadcast::Sender<Event>,
}

impl Default for SavedEvents {
    fn default() -> Self {
        Self::new()
    }
}

impl SavedEvents {
    /// A fan-out with no waiter yet. A waiter more than 1,024 announcements
    /// behind is woken to read again, never blocks the announcer.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(1024).0,
        }
    }

    /// Announces that `task`'s result was saved (call it after the commit).
    ///
    /// ```
    /// taskfence::runtime::SavedEvents::new().saved(taskfence::TaskId::new());
    /// ```
    pub fn saved(&self, task: TaskId) {
        let _ = self.tx.send(Event::Saved(task)); // no waiter: nobody to tell
    }

    /// Announces that announcements may have been missed (the connection
    /// they came on was lost): every waiter reads again.
    ///
    /// ```
    /// taskfence::runtime::SavedEvents::new().resync();
    /// ```
    pub fn resync(&self) {
        let _ = self.tx.send(Event::Resync);
    }

    /// A waiter of every announcement from now on. Subscribe *before*
    /// reading the task, so a result saved between the read and the wait is
    /// not missed.
    ///
    /// ```
    /// let waiter = taskfence::runtime::SavedEvents::new().subscribe();
    /// # drop(waiter);
    /// ```
    pub fn subscribe(&self) -> SavedWaiter {
        SavedWaiter {
            rx: self.tx.subscribe(),
        }
    }

    /// Waiters subscribed right now: the long-polls in progress (a gauge
    /// worth exporting, and what tests wait on instead of sleeping).
    ///
    /// ```
    /// let events = taskfence::runtime::SavedEvents::new();
    /// let _waiter = events.subscribe();
    /// assert_eq!(events.waiting(), 1);
    /// ```
    pub fn waiting(&self) -> usize {
        self.tx.receiver_count()
    }
}

/// One request's subscription to [`SavedEvents`].
#[derive(Debug)]
pub struct SavedWaiter {
    rx: broadcast::Receiver<Event>,
}

impl SavedWaiter {
    /// Resolves when `task` may have changed: its result was announced, or
    /// announcements may have been missed. Then read the store again. Never
    /// resolves once every [`SavedEvents`] is gone: race it against a deadline.
    ///
    /// ```no_run
    /// # async fn f(events: taskfence::runtime::SavedEvents, task: taskfence::TaskId) {
    /// let mut waiter = events.subscribe();
    /// tokio::select! {
    ///     () = waiter.changed(task) => { /* read the task again */ }
    ///     () = tokio::time::sleep(std::time::Duration::from_secs(30)) => { /* answer as it is */ }
    /// }
    /// # }
    /// ```
    pub async fn changed(&mut self, task: TaskId) {
        loop {
            match self.rx.recv().await {
                Ok(Event::Saved(id)) if id == task => return,
                Ok(Event::Saved(_)) => {}
                Ok(Event::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::SavedEvents;
    use crate::task::TaskId;

    /// `true` when `changed(task)` resolves within a short while.
    async fn wakes(waiter: &mut super::SavedWaiter, task: TaskId) -> bool {
        tokio::time::timeout(Duration::from_millis(50), waiter.changed(task))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_waiter_wakes_for_its_task_or_a_resync_and_not_for_another_task() {
        let events = SavedEvents::new();
        let (mine, other) = (TaskId::new(), TaskId::new());
        let mut waiter = events.subscribe();
        assert_eq!(events.waiting(), 1);
        events.saved(other);
        assert!(!wakes(&mut waiter, mine).await, "another task's announcement");
        events.saved(other);
        events.saved(mine);
        assert!(wakes(&mut waiter, mine).await);
        events.resync();
        assert!(wakes(&mut waiter, mine).await, "a resync wakes every waiter");
        drop(waiter);
        assert_eq!(events.waiting(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_fell_behind_is_woken_to_read_again() {
        let events = SavedEvents::new();
        let mut waiter = events.subscribe();
        for _ in 0..2000 {
            events.saved(TaskId::new());
        }
        assert!(wakes(&mut waiter, TaskId::new()).await);
    }

    #[tokio::test]
    async fn a_waiter_without_announcer_waits_forever() {
        let events = SavedEvents::new();
        let mut waiter = events.subscribe();
        drop(events);
        assert!(!wakes(&mut waiter, TaskId::new()).await);
    }
}
