//! The random interleavings the model-based tests draw, shared by every
//! backend's model test so they all explore the same space.

use proptest::prelude::*;
use taskfence::testing::model::{self, Op};

/// One random step: weights favour claims, completions and clock moves.
pub fn op() -> impl Strategy<Value = Op> {
    let worker = 0u8..model::WORKERS as u8;
    prop_oneof![
        2 => (0u8..4, 0u8..2).prop_map(|(key, input)| Op::Submit { key, input }),
        4 => (worker.clone(), any::<u8>()).prop_map(|(worker, task)| Op::Claim { worker, task }),
        2 => worker.clone().prop_map(|worker| Op::Renew { worker }),
        3 => worker.clone().prop_map(|worker| Op::Complete { worker }),
        2 => (worker.clone(), prop::bool::weighted(0.2)).prop_map(|(worker, permanent)| Op::Fail { worker, permanent }),
        1 => worker.clone().prop_map(|worker| Op::Release { worker }),
        1 => worker.prop_map(|worker| Op::RecordOperation { worker }),
        1 => any::<u8>().prop_map(|task| Op::Cancel { task }),
        3 => (1u8..15).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Purge),
    ]
}

/// A whole interleaving of up to `max_len` steps.
pub fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..max_len)
}
