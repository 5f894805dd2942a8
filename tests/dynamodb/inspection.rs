//! The inspection suite (listings, counts, stories, stranded tasks) against
//! `DynamoStore` on a real DynamoDB API (moto in `scripts/test`), each test
//! on a fresh table of its own.

use taskfence_test_support::dynamo;

taskfence::testing::inspection_suite!(dynamo::fixture());
