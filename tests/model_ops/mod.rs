//! The random interleavings the model-based tests draw, shared by every
//! backend's model test so they all explore the same space.

use proptest::prelude::*;
use taskfence::testing::model::{self, Op};

/// One random step: weights favour claims, completions and clock moves.
pub(crate) fn op() -> impl Strategy<Value = Op> {
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
        1 => any::<u8>().prop_map(|task| Op::Retry { task }),
    ]
}

/// A whole interleaving of up to `max_len` steps.
pub(crate) fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..max_len)
}

/// Shrunk counterexamples found while mutation-testing the rules, replayed
/// against every backend as named regression tests.
pub(crate) mod regressions {
    use taskfence::testing::model::Op::{self, *};

    /// Found with the budget check off by one: the third claim after two
    /// expired or failed attempts must answer `Failed`, not acquire a fourth.
    pub(crate) fn claim_after_spent_budget_is_failed() -> Vec<Op> {
        vec![
            Submit { key: 2, input: 0 },
            Claim { worker: 0, task: 0 },
            Advance { secs: 10 },
            Claim { worker: 2, task: 0 },
            Fail {
                worker: 2,
                permanent: false,
            },
            Advance { secs: 4 },
            Submit { key: 1, input: 0 },
            Claim { worker: 0, task: 216 },
            Submit { key: 0, input: 0 },
            Advance { secs: 10 },
            Claim { worker: 0, task: 189 },
        ]
    }

    /// Found with "done means done" broken: a claim of a completed task must not acquire.
    pub(crate) fn claim_of_completed_task_answers_completed() -> Vec<Op> {
        vec![
            Submit { key: 0, input: 0 },
            Submit { key: 0, input: 0 },
            Claim { worker: 0, task: 0 },
            Complete { worker: 0 },
            Claim { worker: 0, task: 0 },
        ]
    }
}
