//! The journal the tests keep, and the checks over it.
//!
//! [`MemoryJournal`] keeps every [`Event`] in order so [`check`] can prove,
//! after a run, that no commit ever passed an unfinished record, that a new
//! owner resumed from the committed offset, and that a re-read record of a
//! completed task never reached the provider.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;

use taskfence::TaskId;

use taskfence_kafka::journal::{Event, Handled, Journal};

/// Keeps every event in arrival order (one lock, so the order is total).
#[derive(Debug, Default)]
pub struct MemoryJournal {
    events: Mutex<Vec<Event>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("journal lock").clone()
    }

    /// Number of events matching `pred`.
    pub fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.events
            .lock()
            .expect("journal lock")
            .iter()
            .filter(|e| pred(e))
            .count()
    }
}

impl Journal for MemoryJournal {
    fn record(&self, event: Event) {
        self.events.lock().expect("journal lock").push(event);
    }
}

/// A broken promise found by [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`check`] verified, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Commits issued, each checked against every record below it.
    pub commits: usize,
    /// Commits issued per consumer.
    pub commits_by: BTreeMap<String, usize>,
    /// Assignments whose first record was compared with the committed offset.
    pub resumptions: usize,
    /// Of those, assignments that resumed from an offset some consumer had committed.
    pub resumed_from_commit: usize,
    /// Records received whose task was already settled when received.
    pub rereads: usize,
    /// Provider calls.
    pub provider_calls: usize,
}

/// Checks a journal:
///
/// 1. **No commit passed an unfinished record**: for every issued commit of
///    offset `c` in partition `p`, every produced record of `p` below `c` was
///    [`Finished`](Event::Finished) (by some consumer) before the commit.
/// 2. **Resumed from the committed offset**: after every assignment, the first
///    record the consumer received from that partition is exactly the
///    committed offset it read at assignment (the partition's first produced
///    offset when nothing was committed), and that committed offset is one a
///    consumer issued, no lower than any the broker had acknowledged.
/// 3. **Done means done**: no provider call for a task starts after a
///    consumer saw the task completed.
pub fn check(events: &[Event]) -> Result<Checked, Vec<Violation>> {
    let mut violations = Vec::new();
    let mut checked = Checked::default();

    // Every produced offset per partition (delivery reports may arrive after the
    // record was consumed, so they are taken regardless of position).
    let mut produced: HashMap<i32, Vec<i64>> = HashMap::new();
    for e in events {
        if let Event::Produced {
            partition, offset, ..
        } = e
        {
            produced.entry(*partition).or_default().push(*offset);
        }
    }
    for offsets in produced.values_mut() {
        offsets.sort_unstable();
    }

    // 1. Commits never pass an unfinished record.
    let mut finished: HashMap<i32, HashSet<i64>> = HashMap::new();
    for e in events {
        match e {
            Event::Finished {
                partition, offset, ..
            } => {
                finished.entry(*partition).or_default().insert(*offset);
            }
            Event::Commit {
                consumer,
                partition,
                offset,
                with,
            } => {
                checked.commits += 1;
                *checked.commits_by.entry(consumer.clone()).or_default() += 1;
                let done = finished.get(partition);
                for o in produced
                    .get(partition)
                    .into_iter()
                    .flatten()
                    .take_while(|o| **o < *offset)
                {
                    if Some(*o) != *with && !done.is_some_and(|d| d.contains(o)) {
                        violations.push(Violation(format!(
                            "{consumer} committed {offset} in partition {partition} while record {o} was unfinished"
                        )));
                    }
                }
            }
            _ => {}
        }
    }

    // 2. Every assignment resumes from the committed offset.
    let mut issued: HashMap<i32, HashSet<i64>> = HashMap::new();
    let mut acked_max: HashMap<i32, i64> = HashMap::new();
    // (consumer, partition) -> expected first offset, while waiting for the first record.
    let mut waiting: HashMap<(String, i32), (i64, bool)> = HashMap::new();
    for e in events {
        match e {
            Event::Commit {
                partition, offset, ..
            } => {
                issued.entry(*partition).or_default().insert(*offset);
            }
            Event::CommitResult {
                partition,
                offset,
                ok: true,
                ..
            } => {
                let m = acked_max.entry(*partition).or_insert(*offset);
                *m = (*m).max(*offset);
            }
            Event::Assigned {
                consumer,
                partition,
                committed,
            } => {
                let from_commit = committed.is_some();
                if let Some(c) = committed {
                    if !issued.get(partition).is_some_and(|s| s.contains(c)) {
                        violations.push(Violation(format!(
                            "{consumer} was assigned partition {partition} at committed offset {c}, which no consumer committed"
                        )));
                    }
                    if let Some(a) = acked_max.get(partition).filter(|a| *a > c) {
                        violations.push(Violation(format!(
                            "{consumer} was assigned partition {partition} at {c}, below the acknowledged commit {a}"
                        )));
                    }
                }
                let expected = committed.or_else(|| produced.get(partition).and_then(|o| o.first().copied()));
                if let Some(expected) = expected {
                    waiting.insert((consumer.clone(), *partition), (expected, from_commit));
                }
            }
            Event::Revoked { consumer, partition } => {
                waiting.remove(&(consumer.clone(), *partition));
            }
            Event::Received {
                consumer,
                partition,
                offset,
                ..
            } => {
                if let Some((expected, from_commit)) = waiting.remove(&(consumer.clone(), *partition)) {
                    checked.resumptions += 1;
                    checked.resumed_from_commit += usize::from(from_commit);
                    if *offset != expected {
                        violations.push(Violation(format!(
                            "{consumer} resumed partition {partition} at {offset}, not at the committed {expected}"
                        )));
                    }
                }
            }
            _ => {}
        }
    }

    // 3. No provider call after the task was seen completed; count re-reads.
    let mut settled: HashSet<TaskId> = HashSet::new();
    let mut completed: HashSet<TaskId> = HashSet::new();
    for e in events {
        match e {
            Event::Finished {
                task: Some(task),
                handled,
                ..
            } => {
                settled.insert(*task);
                if matches!(
                    handled,
                    Handled::Completed | Handled::AlreadyCompleted | Handled::CompletedElsewhere
                ) {
                    completed.insert(*task);
                }
            }
            Event::Received { task: Some(task), .. } if settled.contains(task) => checked.rereads += 1,
            Event::ProviderCall {
                worker,
                task,
                version,
            } => {
                checked.provider_calls += 1;
                if completed.contains(task) {
                    violations.push(Violation(format!(
                        "{worker} called the provider for completed task {task} (version {version})"
                    )));
                }
            }
            _ => {}
        }
    }

    if violations.is_empty() {
        Ok(checked)
    } else {
        Err(violations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produced(partition: i32, offsets: std::ops::Range<i64>) -> Vec<Event> {
        offsets
            .map(|offset| Event::Produced {
                partition,
                offset,
                task: TaskId::new(),
            })
            .collect()
    }

    fn finished(partition: i32, offset: i64) -> Event {
        Event::Finished {
            consumer: "a".into(),
            partition,
            offset,
            task: None,
            handled: Handled::Malformed,
        }
    }

    fn commit(partition: i32, offset: i64) -> Event {
        Event::Commit {
            consumer: "a".into(),
            partition,
            offset,
            with: None,
        }
    }

    #[test]
    fn a_commit_past_an_unfinished_record_is_caught() {
        let mut events = produced(0, 0..3);
        events.extend([finished(0, 0), finished(0, 2), commit(0, 1)]);
        assert!(check(&events).is_ok(), "committing 1 only needs 0 finished");
        events.push(commit(0, 3));
        let violations = check(&events).unwrap_err();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].0.contains("record 1 was unfinished"));
    }

    #[test]
    fn a_position_saved_with_a_completion_covers_only_that_record() {
        let mut events = produced(2, 0..3);
        events.push(finished(2, 0));
        let saved = |offset, with| Event::Commit {
            consumer: "a".into(),
            partition: 2,
            offset,
            with: Some(with),
        };
        events.push(saved(2, 1));
        assert!(
            check(&events).is_ok(),
            "record 1 completed in the same transaction"
        );
        events.push(saved(3, 1));
        assert!(
            check(&events).is_err(),
            "record 2 is neither finished nor saved with it"
        );
    }

    #[test]
    fn a_finish_after_the_commit_does_not_excuse_it() {
        let mut events = produced(0, 0..2);
        events.extend([finished(0, 0), commit(0, 2), finished(0, 1)]);
        assert!(check(&events).is_err());
    }

    #[test]
    fn resuming_elsewhere_than_the_committed_offset_is_caught() {
        let mut events = produced(1, 0..5);
        events.extend([finished(1, 0), finished(1, 1), commit(1, 2)]);
        let assigned = Event::Assigned {
            consumer: "b".into(),
            partition: 1,
            committed: Some(2),
        };
        let received = |offset| Event::Received {
            consumer: "b".into(),
            partition: 1,
            offset,
            task: None,
        };
        let mut good = events.clone();
        good.extend([assigned.clone(), received(2)]);
        let checked = check(&good).unwrap();
        assert_eq!((checked.resumptions, checked.resumed_from_commit), (1, 1));
        let mut skipped = events.clone();
        skipped.extend([assigned, received(3)]);
        assert!(
            check(&skipped).is_err(),
            "resuming past the committed offset loses record 2"
        );
        let mut invented = events;
        invented.extend([Event::Assigned {
            consumer: "b".into(),
            partition: 1,
            committed: Some(4),
        }]);
        assert!(check(&invented).is_err(), "nobody committed 4");
    }

    #[test]
    fn a_provider_call_after_completion_is_caught() {
        let task = TaskId::new();
        let call = Event::ProviderCall {
            worker: "a".into(),
            task,
            version: 2,
        };
        let done = Event::Finished {
            consumer: "a".into(),
            partition: 0,
            offset: 0,
            task: Some(task),
            handled: Handled::Completed,
        };
        assert!(check(&[call.clone(), done.clone()]).is_ok());
        assert!(check(&[done, call]).is_err());
    }
}
