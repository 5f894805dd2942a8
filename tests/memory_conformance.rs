//! The whole conformance suite against `MemoryStore` on a manual clock.

taskfence::conformance_suite!(async { taskfence::testing::MemoryFixture::new() });
