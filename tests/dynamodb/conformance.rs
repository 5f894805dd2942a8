//! The whole conformance suite against `DynamoStore` on a real DynamoDB API
//! (moto in `scripts/test`), each test on a fresh table of its own.

use taskfence_test_support::dynamo;

taskfence::testing::conformance_suite!(dynamo::fixture());
