//! `DynamoStore` on a real DynamoDB API (moto in `scripts/test`): every
//! suite and every concern, one test binary, each test on a fresh table.

mod bad_input;
mod budget;
mod clock_skew;
mod conformance;
mod dispatch;
mod effects;
mod faults;
mod inspection;
mod limits;
mod model;
mod races;
mod refusals;
mod requests;
mod transactions;
