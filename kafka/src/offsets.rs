//! [`OffsetTracker`]: where a Kafka-style consumer may commit, given records
//! that finish out of order.
//!
//! A consumer group's committed offset is where the group resumes after a
//! crash or a rebalance. Processing several records of one partition at once
//! means they finish out of order; committing the highest finished offset
//! would skip an earlier record that is still running, and a crash would lose
//! it. The safe position is the *lowest unfinished* offset, or one past the
//! highest seen when nothing is unfinished. Committing never deletes a record:
//! it only moves the place the group re-reads from.
//!
//! Pure bookkeeping, no Kafka dependency: the Kafka worker template drives it.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// Per partition: the records in flight and the position that is safe to commit.
///
/// ```
/// use taskfence_kafka::offsets::OffsetTracker;
/// let mut t = OffsetTracker::new();
/// for offset in 41..=43 {
///     t.start(0, offset);
/// }
/// t.finish(&0, 42);
/// t.finish(&0, 43);
/// assert_eq!(t.committable(&0), Some(41)); // 41 is still running: resume there
/// t.finish(&0, 41);
/// assert_eq!(t.committable(&0), Some(44)); // all done: one past the last
/// assert_eq!(t.take_commit(&0), Some(44));
/// assert_eq!(t.take_commit(&0), None); // nothing new to commit
/// ```
#[derive(Debug, Clone)]
pub struct OffsetTracker<P = i32> {
    partitions: HashMap<P, Partition>,
}

#[derive(Debug, Clone, Default)]
struct Partition {
    in_flight: BTreeSet<i64>,
    /// Highest offset started in this assignment.
    highest: Option<i64>,
    /// Last position handed out by `take_commit`.
    committed: Option<i64>,
}

impl Partition {
    fn committable(&self) -> Option<i64> {
        self.in_flight.first().copied().or(self.highest.map(|h| h + 1))
    }
}

impl<P: Eq + Hash + Clone> Default for OffsetTracker<P> {
    fn default() -> Self {
        Self {
            partitions: HashMap::new(),
        }
    }
}

impl<P: Eq + Hash + Clone> OffsetTracker<P> {
    /// An empty tracker. `P` identifies a partition: an `i32` for one topic, or `(String, i32)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that processing of `offset` in `partition` has started.
    pub fn start(&mut self, partition: P, offset: i64) {
        let p = self.partitions.entry(partition).or_default();
        p.in_flight.insert(offset);
        p.highest = Some(p.highest.map_or(offset, |h| h.max(offset)));
    }

    /// Records that `offset` is durably handled (its task saved or terminal).
    /// Returns `false` if it was not in flight (unknown, or its partition was revoked).
    pub fn finish(&mut self, partition: &P, offset: i64) -> bool {
        self.partitions
            .get_mut(partition)
            .is_some_and(|p| p.in_flight.remove(&offset))
    }

    /// The position that is safe to commit now: the lowest unfinished offset,
    /// or one past the highest seen when none is unfinished. `None` before any record.
    pub fn committable(&self, partition: &P) -> Option<i64> {
        self.partitions.get(partition).and_then(Partition::committable)
    }

    /// The committable position if it moved past the last one taken, marking it taken.
    /// Call it after finishing records and commit what it returns.
    pub fn take_commit(&mut self, partition: &P) -> Option<i64> {
        let p = self.partitions.get_mut(partition)?;
        let position = p.committable()?;
        if p.committed.is_some_and(|c| c >= position) {
            return None;
        }
        p.committed = Some(position);
        Some(position)
    }

    /// Records in flight in `partition`.
    pub fn in_flight(&self, partition: &P) -> usize {
        self.partitions.get(partition).map_or(0, |p| p.in_flight.len())
    }

    /// The partition was revoked: returns the last safe position to commit
    /// (if it moved) and stops tracking it. Records still in flight there are
    /// forgotten: the next owner re-reads them from the committed position.
    pub fn revoke(&mut self, partition: &P) -> Option<i64> {
        let position = self.take_commit(partition);
        self.partitions.remove(partition);
        position
    }

    /// Partitions currently tracked.
    pub fn partitions(&self) -> impl Iterator<Item = &P> {
        self.partitions.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_restart_at_41_resumes_at_41_then_commits_42() {
        let mut t = OffsetTracker::new();
        t.start(0, 41);
        assert_eq!(t.committable(&0), Some(41), "a crash now re-reads 41");
        assert!(t.finish(&0, 41));
        assert_eq!(t.take_commit(&0), Some(42));
    }

    #[test]
    fn revoke_commits_what_is_safe_and_forgets_the_partition() {
        let mut t = OffsetTracker::new();
        t.start(3, 10);
        t.start(3, 11);
        t.finish(&3, 10);
        assert_eq!(
            t.revoke(&3),
            Some(11),
            "11 is unfinished: the next owner re-reads it"
        );
        assert_eq!(t.committable(&3), None);
        assert!(
            !t.finish(&3, 11),
            "a late finish of a revoked partition is ignored"
        );
        assert_eq!(t.partitions().count(), 0);
    }

    #[test]
    fn partitions_are_independent() {
        let mut t = OffsetTracker::<(String, i32)>::new();
        let (a, b) = (("replies".to_owned(), 0), ("replies".to_owned(), 1));
        t.start(a.clone(), 5);
        t.start(b.clone(), 100);
        t.finish(&b, 100);
        assert_eq!(t.committable(&a), Some(5));
        assert_eq!(t.committable(&b), Some(101));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Start,
        Finish(usize),
        Revoke,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                4 => Just(Step::Start),
                4 => any::<usize>().prop_map(Step::Finish),
                1 => Just(Step::Revoke),
            ],
            1..200,
        )
    }

    proptest! {
        /// Records arrive in offset order (with gaps, as after compaction) and
        /// finish in any order; the committable position never passes an
        /// unfinished record, and never moves backwards within an assignment.
        #[test]
        fn never_past_an_unfinished_record(steps in steps(), gaps in prop::collection::vec(1i64..4, 200)) {
            let mut t = OffsetTracker::new();
            let mut next = 0i64;
            let mut unfinished: Vec<i64> = Vec::new();
            let mut last_taken: Option<i64> = None;
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Start => {
                        next += gaps[i % gaps.len()];
                        t.start(0, next);
                        unfinished.push(next);
                    }
                    Step::Finish(pick) if !unfinished.is_empty() => {
                        let offset = unfinished.remove(pick % unfinished.len());
                        prop_assert!(t.finish(&0, offset));
                    }
                    Step::Finish(_) => {}
                    Step::Revoke => {
                        let position = t.revoke(&0);
                        if let (Some(p), Some(low)) = (position, unfinished.iter().min()) {
                            prop_assert!(p <= *low);
                        }
                        prop_assert_eq!(t.committable(&0), None);
                        unfinished.clear();
                        last_taken = None;
                        continue;
                    }
                }
                if let Some(position) = t.committable(&0) {
                    if let Some(low) = unfinished.iter().min() {
                        prop_assert!(position <= *low, "position {} passes unfinished {}", position, low);
                        prop_assert_eq!(position, *low);
                    } else {
                        prop_assert_eq!(position, next + 1, "all finished: one past the last");
                    }
                }
                if let Some(taken) = t.take_commit(&0) {
                    prop_assert!(last_taken.is_none_or(|l| taken > l), "commits only move forward");
                    last_taken = Some(taken);
                }
            }
        }

        /// Once every started record finishes, the position is one past the last, whatever the order.
        #[test]
        fn all_finished_yields_one_past_the_last(offsets in prop::collection::btree_set(0i64..10_000, 1..100), seed in any::<u64>()) {
            let mut t = OffsetTracker::new();
            let offsets: Vec<i64> = offsets.into_iter().collect();
            for &o in &offsets {
                t.start(7, o);
            }
            let mut order = offsets.clone();
            // A deterministic shuffle driven by the drawn `seed` value.
            let mut s = seed | 1;
            for i in (1..order.len()).rev() {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                order.swap(i, (s % (i as u64 + 1)) as usize);
            }
            for o in order {
                prop_assert!(t.finish(&7, o));
            }
            prop_assert_eq!(t.committable(&7), Some(offsets.last().unwrap() + 1));
            prop_assert_eq!(t.in_flight(&7), 0);
        }
    }
}
