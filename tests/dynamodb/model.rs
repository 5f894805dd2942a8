//! Model-based property test against `DynamoStore` on a real DynamoDB API:
//! the same random interleavings and reference model as the `MemoryStore`
//! one, fewer cases (each gets a fresh table). Time moves through the
//! store's own clock (`DynamoFixture::advance`).

taskfence::testing::model_suite!(taskfence_test_support::dynamo::fixture(), cases = 150, steps = 40);
