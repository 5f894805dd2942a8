//! Model-based property test against `DynamoStore` on a real DynamoDB API:
//! the same random interleavings and reference model as the `MemoryStore`
//! one, 1,000 cases of 40 steps (each on a fresh table; about 3.5 minutes
//! against moto on two cores). Time moves through the store's own clock
//! (`DynamoFixture::advance`).

taskfence::testing::model_suite!(
    taskfence_test_support::dynamo::fixture(),
    cases = 1000,
    steps = 40
);
