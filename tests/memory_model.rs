//! Model-based property test: random interleavings of every operation across
//! several workers, against `MemoryStore`, checked after every step against
//! the reference model in `taskfence::testing::model`.

use proptest::prelude::*;
use taskfence::testing::MemoryFixture;
use taskfence::testing::model::{self, Op};

fn op() -> impl Strategy<Value = Op> {
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_agrees_with_the_model(ops in prop::collection::vec(op(), 1..60)) {
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }
}

/// Shrunk counterexamples found while mutation-testing the rules, kept as regressions.
mod regressions {
    use super::*;
    use Op::*;

    /// Found with the budget check off by one: the third claim after two
    /// expired or failed attempts must answer `Failed`, not acquire a fourth.
    #[test]
    fn claim_after_spent_budget_is_failed() {
        let ops = [
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
        ];
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }

    /// Found with "done means done" broken: a claim of a completed task must not acquire.
    #[test]
    fn claim_of_completed_task_answers_completed() {
        let ops = [
            Submit { key: 0, input: 0 },
            Submit { key: 0, input: 0 },
            Claim { worker: 0, task: 0 },
            Complete { worker: 0 },
            Claim { worker: 0, task: 0 },
        ];
        runtime().block_on(model::run(&MemoryFixture::new(), &ops));
    }
}
