//! Versions on the wire: the task id and assignment version a message
//! carries in its headers ([`Stamp`]), and [`NewestPerTask`], which lets a
//! downstream consumer keep only the newest assignment of each task.
//!
//! Why: queues repeat and reorder. The store saves one result per task, but
//! an operator's [`reopen`](crate::TaskStore::reopen) lets a later
//! assignment save another, and a late copy of the earlier one can still
//! arrive after it. Each message names the assignment it came from, so a
//! consumer can tell the two apart without asking the store.
//!
//! The stamp travels as two headers (Kafka record headers, SQS message
//! attributes of type `String`): [`TASK_ID_HEADER`] with the task id as a
//! hyphenated UUID, [`VERSION_HEADER`] with the version in decimal.
//!
//! ```
//! use taskfence::wire::{NewestPerTask, Stamp};
//! let task = taskfence::TaskId::new();
//! let mut newest = NewestPerTask::new();
//! assert!(newest.observe(Stamp::new(task, 3))); // keep
//! assert!(!newest.observe(Stamp::new(task, 2))); // older than one seen: drop
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::lease::Lease;
use crate::task::{Task, TaskId};

/// The header (SQS message attribute) naming the task: a hyphenated UUID.
///
/// ```
/// assert_eq!(taskfence::wire::TASK_ID_HEADER, "taskfence-task-id");
/// ```
pub const TASK_ID_HEADER: &str = "taskfence-task-id";

/// The header (SQS message attribute) naming the assignment version: decimal digits.
///
/// ```
/// assert_eq!(taskfence::wire::VERSION_HEADER, "taskfence-version");
/// ```
pub const VERSION_HEADER: &str = "taskfence-version";

/// Which task and which assignment of it a message is about.
///
/// On a published task message (a handoff the dispatcher published, or a
/// task published again by [`republish_due`](crate::republish::republish_due))
/// the version is the task's assignment version when the round read it: the claim that message
/// leads to gets a higher one. On a published result it is the version of
/// the assignment that saved the result ([`Task::version`] of the completed
/// task, [`Lease::version`] of the lease that completed it).
///
/// ```
/// use taskfence::wire::Stamp;
/// let stamp = Stamp::new(taskfence::TaskId::new(), 2);
/// let headers = stamp.headers();
/// assert_eq!(headers[1], ("taskfence-version", "2".to_owned()));
/// assert_eq!(Stamp::from_headers(headers), Ok(stamp));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Stamp {
    /// The task.
    pub task_id: TaskId,
    /// The assignment version (see the type's documentation for which one).
    pub version: u64,
}

impl Stamp {
    /// The stamp of assignment `version` of task `task_id`.
    ///
    /// ```
    /// let id = taskfence::TaskId::new();
    /// assert_eq!(taskfence::wire::Stamp::new(id, 1).task_id, id);
    /// ```
    pub fn new(task_id: TaskId, version: u64) -> Self {
        Self { task_id, version }
    }

    /// The two headers to put on a message: `(name, value)` pairs, the task
    /// id first. Kafka takes the value's bytes, SQS a `String` attribute.
    ///
    /// ```
    /// use taskfence::wire::{Stamp, TASK_ID_HEADER, VERSION_HEADER};
    /// let id = taskfence::TaskId::new();
    /// assert_eq!(
    ///     Stamp::new(id, 7).headers(),
    ///     [(TASK_ID_HEADER, id.to_string()), (VERSION_HEADER, "7".to_owned())]
    /// );
    /// ```
    pub fn headers(&self) -> [(&'static str, String); 2] {
        [
            (TASK_ID_HEADER, self.task_id.to_string()),
            (VERSION_HEADER, self.version.to_string()),
        ]
    }

    /// Reads the stamp out of a message's headers: `(name, value)` pairs in
    /// any order, others ignored (Kafka headers as `(key, value bytes)`, SQS
    /// attributes as `(name, string value)`). Names match exactly. A header
    /// repeated with the same value is accepted; with another value the stamp
    /// is ambiguous and refused.
    ///
    /// ```
    /// use taskfence::wire::{Stamp, StampError, VERSION_HEADER};
    /// let id = taskfence::TaskId::new();
    /// let headers = [
    ///     ("traceparent", b"00-abc".to_vec()),
    ///     ("taskfence-version", b"3".to_vec()),
    ///     ("taskfence-task-id", id.to_string().into_bytes()),
    /// ];
    /// assert_eq!(Stamp::from_headers(headers), Ok(Stamp::new(id, 3)));
    /// assert_eq!(
    ///     Stamp::from_headers([("taskfence-task-id", id.to_string())]),
    ///     Err(StampError::Missing { header: VERSION_HEADER })
    /// );
    /// ```
    pub fn from_headers<I, K, V>(headers: I) -> Result<Self, StampError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let (mut task_id, mut version) = (None, None);
        for (name, value) in headers {
            let (header, slot) = match name.as_ref() {
                TASK_ID_HEADER => (TASK_ID_HEADER, &mut task_id),
                VERSION_HEADER => (VERSION_HEADER, &mut version),
                _ => continue,
            };
            let value = value.as_ref().to_vec();
            match slot {
                Some(seen) if *seen != value => return Err(StampError::Conflicting { header }),
                Some(_) => {}
                None => *slot = Some(value),
            }
        }
        let task_id = task_id.ok_or(StampError::Missing {
            header: TASK_ID_HEADER,
        })?;
        let version = version.ok_or(StampError::Missing {
            header: VERSION_HEADER,
        })?;
        Ok(Self {
            task_id: parse_task_id(&task_id)?,
            version: parse_version(&version)?,
        })
    }
}

fn parse_task_id(value: &[u8]) -> Result<TaskId, StampError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| StampError::invalid(TASK_ID_HEADER, value))
}

fn parse_version(value: &[u8]) -> Result<u64, StampError> {
    std::str::from_utf8(value)
        .ok()
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| StampError::invalid(VERSION_HEADER, value))
}

impl From<&Task> for Stamp {
    /// The task's id and its current assignment version.
    fn from(task: &Task) -> Self {
        Self::new(task.id, task.version)
    }
}

impl From<&Lease> for Stamp {
    /// The leased task's id and the lease's assignment version.
    fn from(lease: &Lease) -> Self {
        Self::new(lease.task_id(), lease.version())
    }
}

impl fmt::Display for Stamp {
    /// `<task id> v<version>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} v{}", self.task_id, self.version)
    }
}

/// Why a message's headers hold no valid [`Stamp`].
///
/// ```
/// use taskfence::wire::{Stamp, StampError};
/// let err = Stamp::from_headers([("taskfence-task-id", "x"), ("taskfence-version", "1")]).unwrap_err();
/// assert!(matches!(err, StampError::Invalid { header: "taskfence-task-id", .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StampError {
    /// The header is absent (a message from before stamps, or another producer).
    #[error("the message has no `{header}` header")]
    Missing {
        /// [`TASK_ID_HEADER`] or [`VERSION_HEADER`].
        header: &'static str,
    },
    /// The header's value is not a task id (a UUID) or a version (decimal digits).
    #[error("the `{header}` header is not valid: {value:?}")]
    Invalid {
        /// [`TASK_ID_HEADER`] or [`VERSION_HEADER`].
        header: &'static str,
        /// The value as text (invalid UTF-8 replaced), cut at 64 characters.
        value: String,
    },
    /// The header appears twice with different values: the stamp is ambiguous.
    #[error("the `{header}` header appears twice with different values")]
    Conflicting {
        /// [`TASK_ID_HEADER`] or [`VERSION_HEADER`].
        header: &'static str,
    },
}

impl StampError {
    fn invalid(header: &'static str, value: &[u8]) -> Self {
        Self::Invalid {
            header,
            value: String::from_utf8_lossy(value).chars().take(64).collect(),
        }
    }
}

/// Remembers the newest assignment version seen of each task, so that a
/// downstream consumer keeps a message only if no newer assignment of its
/// task came before it: a result of assignment 2 arriving after one of
/// assignment 3 is dropped.
///
/// **Equal versions are kept.** A second copy of the same assignment is a
/// duplicate delivery of the same result (the store saves one per
/// assignment); dropping it would lose the message whenever the first copy
/// was not processed to the end (a failure, then a redelivery). The consumer
/// handles it idempotently, as any at-least-once delivery.
///
/// **Memory.** [`new`](Self::new) remembers every task until
/// [`forget`](Self::forget); [`with_capacity`](Self::with_capacity) remembers
/// at most that many, forgetting the least recently observed. A forgotten
/// task starts over: an older copy arriving after that is kept. Size the
/// capacity to cover how far a copy can lag (the tasks seen in that window).
/// The state is in memory: after a restart every task starts over too.
///
/// ```
/// use taskfence::wire::{NewestPerTask, Stamp};
/// let (a, b) = (taskfence::TaskId::new(), taskfence::TaskId::new());
/// let mut newest = NewestPerTask::with_capacity(10_000);
/// assert!(newest.observe(Stamp::new(a, 3)));
/// assert!(newest.observe(Stamp::new(a, 3))); // the same assignment again: kept
/// assert!(!newest.observe(Stamp::new(a, 2))); // an older one: dropped
/// assert!(newest.observe(Stamp::new(b, 1))); // tasks are independent
/// assert_eq!(newest.newest(a), Some(3));
/// ```
#[derive(Debug, Clone, Default)]
pub struct NewestPerTask {
    /// Per task: the newest version, and when it was last observed.
    newest: HashMap<TaskId, (u64, u64)>,
    /// Last observation → task: the oldest first, for eviction.
    touched: BTreeMap<u64, TaskId>,
    /// Observations so far: the clock of `touched`.
    tick: u64,
    capacity: Option<usize>,
}

impl NewestPerTask {
    /// Remembers every task observed, until [`forget`](Self::forget).
    ///
    /// ```
    /// assert!(taskfence::wire::NewestPerTask::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers at most `capacity` tasks (at least 1), forgetting the least
    /// recently observed one to make room.
    ///
    /// ```
    /// use taskfence::wire::{NewestPerTask, Stamp};
    /// let mut newest = NewestPerTask::with_capacity(1);
    /// let (a, b) = (taskfence::TaskId::new(), taskfence::TaskId::new());
    /// newest.observe(Stamp::new(a, 3));
    /// newest.observe(Stamp::new(b, 1)); // `a` is forgotten
    /// assert_eq!((newest.newest(a), newest.len()), (None, 1));
    /// ```
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: Some(capacity.max(1)),
            ..Self::default()
        }
    }

    /// Records `stamp` and says whether to keep its message: `true` if its
    /// version is the newest seen of its task so far (or equal to it, or the
    /// task is new), `false` if a newer assignment was already seen: drop it.
    ///
    /// ```
    /// use taskfence::wire::{NewestPerTask, Stamp};
    /// let id = taskfence::TaskId::new();
    /// let mut newest = NewestPerTask::new();
    /// let kept: Vec<bool> = [1, 3, 2, 3, 4].map(|v| newest.observe(Stamp::new(id, v))).to_vec();
    /// assert_eq!(kept, [true, true, false, true, true]);
    /// ```
    pub fn observe(&mut self, stamp: Stamp) -> bool {
        self.tick += 1;
        let tick = self.tick;
        let keep = match self.newest.get_mut(&stamp.task_id) {
            Some((version, touched)) => {
                self.touched.remove(touched);
                *touched = tick;
                let keep = stamp.version >= *version;
                *version = (*version).max(stamp.version);
                keep
            }
            None => {
                self.newest.insert(stamp.task_id, (stamp.version, tick));
                true
            }
        };
        self.touched.insert(tick, stamp.task_id);
        if let Some(capacity) = self.capacity {
            while self.newest.len() > capacity {
                let Some((_, oldest)) = self.touched.pop_first() else {
                    break;
                };
                self.newest.remove(&oldest);
            }
        }
        keep
    }

    /// The newest version seen of `task_id`, if it is remembered.
    ///
    /// ```
    /// use taskfence::wire::{NewestPerTask, Stamp};
    /// let id = taskfence::TaskId::new();
    /// let mut newest = NewestPerTask::new();
    /// assert_eq!(newest.newest(id), None);
    /// newest.observe(Stamp::new(id, 2));
    /// assert_eq!(newest.newest(id), Some(2));
    /// ```
    pub fn newest(&self, task_id: TaskId) -> Option<u64> {
        self.newest.get(&task_id).map(|&(version, _)| version)
    }

    /// Forgets `task_id` (say, once its result is final downstream); returns
    /// the newest version that was remembered.
    ///
    /// ```
    /// use taskfence::wire::{NewestPerTask, Stamp};
    /// let id = taskfence::TaskId::new();
    /// let mut newest = NewestPerTask::new();
    /// newest.observe(Stamp::new(id, 2));
    /// assert_eq!(newest.forget(id), Some(2));
    /// assert!(newest.observe(Stamp::new(id, 1))); // starts over
    /// ```
    pub fn forget(&mut self, task_id: TaskId) -> Option<u64> {
        let (version, touched) = self.newest.remove(&task_id)?;
        self.touched.remove(&touched);
        Some(version)
    }

    /// How many tasks are remembered.
    ///
    /// ```
    /// use taskfence::wire::{NewestPerTask, Stamp};
    /// let mut newest = NewestPerTask::new();
    /// newest.observe(Stamp::new(taskfence::TaskId::new(), 1));
    /// assert_eq!(newest.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// `true` when no task is remembered.
    ///
    /// ```
    /// assert!(taskfence::wire::NewestPerTask::with_capacity(8).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_in_any_order_among_others() {
        let stamp = Stamp::new(TaskId::new(), u64::MAX);
        let [id, version] = stamp.headers();
        let shuffled = [("other", "x".to_owned()), version, ("more", String::new()), id];
        assert_eq!(Stamp::from_headers(shuffled), Ok(stamp));
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let id = TaskId::new().to_string();
        let parse = |pairs: &[(&str, &str)]| Stamp::from_headers(pairs.iter().copied());
        assert_eq!(
            parse(&[("taskfence-version", "1")]),
            Err(StampError::Missing {
                header: TASK_ID_HEADER
            })
        );
        assert_eq!(
            parse(&[("Taskfence-Task-Id", &id), ("taskfence-version", "1")]),
            Err(StampError::Missing {
                header: TASK_ID_HEADER
            }),
            "names match exactly"
        );
        for bad in ["", "+1", "-1", " 1", "1.0", "18446744073709551616"] {
            assert!(
                matches!(
                    parse(&[("taskfence-task-id", &id), ("taskfence-version", bad)]),
                    Err(StampError::Invalid {
                        header: VERSION_HEADER,
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            Stamp::from_headers([(TASK_ID_HEADER, id.as_bytes()), (VERSION_HEADER, &[0xff][..])]),
            Err(StampError::Invalid {
                header: VERSION_HEADER,
                value: "\u{fffd}".into()
            })
        );
        assert_eq!(
            parse(&[
                ("taskfence-task-id", &id),
                ("taskfence-version", "1"),
                ("taskfence-version", "2")
            ]),
            Err(StampError::Conflicting {
                header: VERSION_HEADER
            })
        );
        assert_eq!(
            parse(&[
                ("taskfence-task-id", &id),
                ("taskfence-version", "1"),
                ("taskfence-task-id", &id)
            ]),
            Ok(Stamp::new(id.parse().unwrap(), 1)),
            "a repeat with the same value is no conflict"
        );
        let long = "z".repeat(1000);
        let Err(StampError::Invalid { value, .. }) =
            parse(&[("taskfence-task-id", &long), ("taskfence-version", "1")])
        else {
            panic!("a long bad id is invalid");
        };
        assert_eq!(value.len(), 64);
    }

    #[test]
    fn an_older_version_is_dropped_after_a_newer_one_equal_ones_kept() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut newest = NewestPerTask::new();
        assert!(newest.observe(Stamp::new(a, 3)));
        assert!(!newest.observe(Stamp::new(a, 2)));
        assert!(newest.observe(Stamp::new(a, 3)));
        assert!(newest.observe(Stamp::new(b, 0)));
        assert!(!newest.observe(Stamp::new(a, 0)));
        assert!(newest.observe(Stamp::new(a, 5)));
        assert_eq!(
            (newest.newest(a), newest.newest(b), newest.len()),
            (Some(5), Some(0), 2)
        );
    }

    #[test]
    fn a_bounded_one_forgets_the_least_recently_observed() {
        let ids: Vec<TaskId> = (0..3).map(|_| TaskId::new()).collect();
        let mut newest = NewestPerTask::with_capacity(2);
        newest.observe(Stamp::new(ids[0], 5));
        newest.observe(Stamp::new(ids[1], 5));
        // An older copy of ids[0] is dropped, and touches it: ids[1] is now the oldest.
        assert!(!newest.observe(Stamp::new(ids[0], 4)));
        newest.observe(Stamp::new(ids[2], 5));
        assert_eq!(newest.len(), 2);
        assert_eq!(newest.newest(ids[1]), None);
        assert_eq!(newest.newest(ids[0]), Some(5));
        // Forgotten: an older copy is kept (the bound only ever keeps more).
        assert!(newest.observe(Stamp::new(ids[1], 1)));
        assert_eq!(newest.newest(ids[0]), None, "now the least recently observed");
        assert_eq!(newest.newest(ids[2]), Some(5));
        assert_eq!(newest.touched.len(), newest.len(), "one touch entry per task");
    }

    #[test]
    fn forget_removes_the_task_and_its_touch() {
        let id = TaskId::new();
        let mut newest = NewestPerTask::with_capacity(4);
        newest.observe(Stamp::new(id, 2));
        assert_eq!(newest.forget(id), Some(2));
        assert_eq!(newest.forget(id), None);
        assert!(newest.is_empty() && newest.touched.is_empty());
    }

    #[test]
    fn stamps_of_a_task_and_its_lease_agree() {
        let store = crate::MemoryStore::new();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            use crate::TaskStore;
            let new = crate::NewTask::new(
                crate::RequestKey::new("u", "op", "k"),
                crate::InputHash::of(["x"]),
            );
            let task = store.submit(new).await.unwrap().into_task();
            assert_eq!(Stamp::from(&task), Stamp::new(task.id, 0));
            let claim = store
                .claim(
                    task.id,
                    crate::ClaimRequest::new("w", std::time::Duration::from_secs(30)),
                )
                .await
                .unwrap();
            let crate::Claim::Acquired(lease) = claim else {
                panic!("claimed")
            };
            assert_eq!(Stamp::from(&lease), Stamp::new(task.id, 1));
            assert_eq!(Stamp::from(lease.task()), Stamp::from(&lease));
        });
    }
}
