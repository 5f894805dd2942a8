//! Model-based property test against `PgStore` on the real server: the same
//! random interleavings and reference model as the `MemoryStore` one, fewer
//! cases (each gets a fresh schema). Time moves through the store's own
//! clock (`PgFixture::advance` offsets `store_clock()`); `lease_expiry.rs`
//! lets real time pass instead.

taskfence::testing::model_suite!(taskfence_test_support::pooled_fixture(), cases = 300, steps = 40);
