//! The chaos run of the effect journal on `MemoryStore`, at a size that
//! gives figures (printed) beside the contract's assertions.

use taskfence::testing::MemoryFixture;
use taskfence::testing::chaos::{Chaos, Provider, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_kills_workers_between_the_call_and_the_completion() {
    for provider in [Provider::Idempotent, Provider::IgnoresKeys] {
        let chaos = Chaos {
            tasks: 1000,
            ..Chaos::new(provider)
        };
        let report = run(&MemoryFixture::new(), chaos).await;
        println!("memory chaos {provider:?}: {report:?}");
        report.assert_contract(&chaos);
    }
}
