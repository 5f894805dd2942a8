//! An in-process at-least-once queue with SQS Standard's rules: receiving a
//! message hides it for a visibility timeout; a worker deletes it after the
//! durable save or changes its visibility to come back later; a message that
//! is neither deleted nor changed in time is delivered again. The queue may
//! also hold extra copies of a message (the dispatcher published twice).
//!
//! The queue does not own a clock: operations that hide a message return the
//! [`Wakeup`] the simulation must schedule, and a stale wakeup is ignored.

use std::collections::VecDeque;

/// Index of a message in the queue.
pub type MsgId = usize;

/// Proof of one receive. Deleting or changing visibility needs the *latest*
/// receipt: a worker holding an older one (its visibility ran out and the
/// message went to someone else) changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The message.
    pub msg: MsgId,
    generation: u64,
}

/// "Make this message visible again at the scheduled time, unless it has been
/// received, changed or deleted since."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wakeup {
    /// The message.
    pub msg: MsgId,
    generation: u64,
}

#[derive(Debug)]
struct Message {
    task: usize,
    copy: bool,
    /// Bumped by every receive: names the latest receipt.
    receipt: u64,
    /// Bumped by every receive and visibility change: names the live wakeup.
    wake: u64,
    receives: u32,
    /// The last hiding was a visibility change (a wait), not a receive.
    waited: bool,
    deleted: bool,
}

/// A received message, as a worker sees it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// The receipt for delete / change visibility.
    pub receipt: Receipt,
    /// The task the message points to (the demo's task index).
    pub task: usize,
    /// This message is an extra copy of the task's first message.
    pub copy: bool,
    /// How many times this message has been received, this one included.
    pub receives: u32,
    /// It came back because a worker hid it for a wait (busy, backoff), not
    /// because its visibility timeout ran out.
    pub after_wait: bool,
}

/// The queue.
#[derive(Debug, Default)]
pub struct Queue {
    messages: Vec<Message>,
    ready: VecDeque<MsgId>,
}

impl Queue {
    /// Publishes a message for `task`; it becomes visible when the returned
    /// wakeup fires. `copy` marks a duplicate publication.
    pub fn publish(&mut self, task: usize, copy: bool) -> Wakeup {
        self.messages.push(Message {
            task,
            copy,
            receipt: 0,
            wake: 0,
            receives: 0,
            waited: false,
            deleted: false,
        });
        Wakeup {
            msg: self.messages.len() - 1,
            generation: 0,
        }
    }

    /// Makes the message visible if the wakeup is still current. Returns
    /// whether it became deliverable.
    pub fn wake(&mut self, wakeup: Wakeup) -> bool {
        let m = &self.messages[wakeup.msg];
        if m.deleted || m.wake != wakeup.generation {
            return false;
        }
        self.ready.push_back(wakeup.msg);
        true
    }

    /// `true` when a visible message waits for a worker.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Receives the oldest visible message, hiding it: the returned wakeup
    /// (scheduled one visibility timeout later) redelivers it unless it is
    /// deleted or changed before.
    pub fn receive(&mut self) -> Option<(Delivery, Wakeup)> {
        while let Some(msg) = self.ready.pop_front() {
            let m = &mut self.messages[msg];
            if m.deleted {
                continue;
            }
            m.receipt += 1;
            m.wake += 1;
            m.receives += 1;
            let receipt = Receipt {
                msg,
                generation: m.receipt,
            };
            let delivery = Delivery {
                receipt,
                task: m.task,
                copy: m.copy,
                receives: m.receives,
                after_wait: std::mem::take(&mut m.waited),
            };
            return Some((
                delivery,
                Wakeup {
                    msg,
                    generation: m.wake,
                },
            ));
        }
        None
    }

    /// Deletes the message if `receipt` is the latest one. Returns whether it did.
    pub fn delete(&mut self, receipt: Receipt) -> bool {
        let m = &mut self.messages[receipt.msg];
        if m.deleted || m.receipt != receipt.generation {
            return false;
        }
        m.deleted = true;
        true
    }

    /// Changes when the message comes back (the caller schedules the returned
    /// wakeup), if `receipt` is the latest one.
    pub fn change_visibility(&mut self, receipt: Receipt) -> Option<Wakeup> {
        let m = &mut self.messages[receipt.msg];
        if m.deleted || m.receipt != receipt.generation {
            return None;
        }
        // The receipt stays valid for a later delete, as in SQS.
        m.wake += 1;
        m.waited = true;
        Some(Wakeup {
            msg: receipt.msg,
            generation: m.wake,
        })
    }

    /// Pushes the visibility timeout out again while a worker is still busy
    /// with the message (its lease is being renewed), if `receipt` is the
    /// latest one. The caller schedules the returned wakeup.
    pub fn extend_visibility(&mut self, receipt: Receipt) -> Option<Wakeup> {
        let m = &mut self.messages[receipt.msg];
        if m.deleted || m.receipt != receipt.generation {
            return None;
        }
        m.wake += 1;
        Some(Wakeup {
            msg: receipt.msg,
            generation: m.wake,
        })
    }

    /// Messages not deleted yet.
    pub fn undeleted(&self) -> usize {
        self.messages.iter().filter(|m| !m.deleted).count()
    }
}
