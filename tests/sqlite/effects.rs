//! The chaos run of the effect journal on SQLite, at a size that gives
//! figures (printed) beside the contract's assertions.

use taskfence::testing::SqliteFixture;
use taskfence::testing::chaos::{Chaos, Provider, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run_kills_workers_between_the_call_and_the_completion() {
    let f = SqliteFixture::new().await;
    for provider in [Provider::Idempotent, Provider::IgnoresKeys] {
        let chaos = Chaos {
            tasks: 300,
            ..Chaos::new(provider)
        };
        let report = run(&f, chaos).await;
        println!("sqlite chaos {provider:?}: {report:?}");
        report.assert_contract(&chaos);
    }
}
