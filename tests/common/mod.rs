//! Helpers of the library's own tests: the public test kit
//! (`taskfence::testing`) and what other crates share too
//! (`taskfence-test-support`).
#![allow(unused_imports)] // each test binary uses a part

pub(crate) use taskfence::testing::{acquire, fail_accepted, new_task, one_winner};
pub(crate) use taskfence_test_support::*;
