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

    /// A long-poll of `task`: `read` it, and again after each announcement
    /// (or possible miss), until `settled` says the read is final, `wait` has
    /// passed or `stop` is requested; then the last read. `wait` zero reads
    /// once. Subscribes before the first read, so a result saved between a
    /// read and the wait is never missed; an announcement only means "read
    /// again": the store is the truth. The first error of `read` ends it.
    ///
    /// Why here: every "`GET /tasks/{id}?wait=30s`" is this loop, and each
    /// hand-written copy is one place to subscribe after the read and miss a
    /// commit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use taskfence::{TaskId, runtime::{SavedEvents, Stop}};
    ///
    /// let (events, stop, task) = (SavedEvents::new(), Stop::new(), TaskId::new());
    /// let reads = std::sync::atomic::AtomicU32::new(0);
    /// let announce = events.clone();
    /// tokio::spawn(async move {
    ///     while announce.waiting() == 0 { tokio::task::yield_now().await }
    ///     announce.saved(task); // what the listener does when the commit is heard
    /// });
    /// let read = || async { Ok::<_, ()>(reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1) };
    /// let last = events.wait_for(task, Duration::from_secs(30), &stop, read, |n| *n == 2).await;
    /// assert_eq!(last, Ok(2), "read, woken by the announcement, read again: settled");
    /// # }
    /// ```
    pub async fn wait_for<T, E, R, F>(
        &self,
        task: TaskId,
        wait: std::time::Duration,
        stop: &super::Stop,
        mut read: R,
        settled: impl Fn(&T) -> bool,
    ) -> Result<T, E>
    where
        R: FnMut() -> F,
        F: Future<Output = Result<T, E>>,
    {
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiter = self.subscribe();
        loop {
            let view = read().await?;
            if settled(&view) || tokio::time::Instant::now() >= deadline || stop.is_requested() {
                return Ok(view);
            }
            tokio::select! {
                () = waiter.changed(task) => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = stop.requested() => {}
            }
        }
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

    /// `wait_for` with a read that counts its calls and is never settled.
    async fn reads_until_unsettled(events: &SavedEvents, wait: Duration, stop: &crate::runtime::Stop) -> u32 {
        let reads = std::sync::atomic::AtomicU32::new(0);
        let read = || async { Ok::<_, ()>(reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1) };
        events
            .wait_for(TaskId::new(), wait, stop, read, |_| false)
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_reads_once_without_a_wait_and_ends_at_its_deadline_or_the_stop() {
        let (events, stop) = (SavedEvents::new(), crate::runtime::Stop::new());
        assert_eq!(reads_until_unsettled(&events, Duration::ZERO, &stop).await, 1);
        let started = tokio::time::Instant::now();
        assert_eq!(
            reads_until_unsettled(&events, Duration::from_secs(30), &stop).await,
            2
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(30),
            "read again at the deadline"
        );
        assert_eq!(events.waiting(), 0, "the waiter is gone with the long-poll");
        let stopping = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopping.request();
        });
        let started = tokio::time::Instant::now();
        assert_eq!(
            reads_until_unsettled(&events, Duration::from_secs(30), &stop).await,
            2
        );
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "a stop answers at once"
        );
        assert_eq!(
            reads_until_unsettled(&events, Duration::from_secs(30), &stop).await,
            1,
            "stopped: no wait"
        );
    }

    #[tokio::test]
    async fn a_failed_read_ends_the_long_poll() {
        let (events, stop) = (SavedEvents::new(), crate::runtime::Stop::new());
        let read = || async { Err::<u32, _>("store down") };
        let answer = events.wait_for(TaskId::new(), Duration::from_secs(30), &stop, read, |_| false);
        assert_eq!(answer.await, Err("store down"));
    }

    #[tokio::test]
    async fn a_waiter_without_announcer_waits_forever() {
        let events = SavedEvents::new();
        let mut waiter = events.subscribe();
        drop(events);
        assert!(!wakes(&mut waiter, TaskId::new()).await);
    }
}
