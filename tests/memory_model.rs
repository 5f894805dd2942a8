//! Model-based property test: random interleavings of every operation across
//! several workers, against `MemoryStore`, checked after every step against
//! the reference model in `taskfence::testing::model`.

mod model_ops;

use proptest::prelude::*;
use taskfence::testing::MemoryFixture;
use taskfence::testing::model::{self, Op};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_agrees_with_the_model(ops in model_ops::ops(60)) {
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
