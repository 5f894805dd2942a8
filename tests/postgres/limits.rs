//! Concurrency keys and rate buckets decided by `PgStore`: the limits
//! suite on the pool, each test in a fresh schema, and on one open
//! transaction of the caller's (`PgStore::on(&mut tx)`).

use crate::common;

taskfence::testing::limits_suite!(common::fixture());

/// The same suite on the caller's transaction: each claim's locks and
/// writes are a savepoint of it.
mod on_transaction {
    taskfence::testing::limits_suite!(async {
        taskfence::testing::PgTxFixture::new(crate::common::fixture().await).await
    });
}
