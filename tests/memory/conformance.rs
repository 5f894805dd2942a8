//! The whole conformance suite against `MemoryStore` on a manual clock.

taskfence::testing::conformance_suite!(async { taskfence::testing::MemoryFixture::new() });
