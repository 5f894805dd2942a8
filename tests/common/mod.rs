//! Helpers of the library's own tests; what other crates share too lives in
//! `taskfence-test-support`.
#![allow(dead_code, unused_imports)] // each test binary uses a part

pub use taskfence_test_support::*;

use taskfence::{InputHash, NewTask, RequestKey};

/// A submission under user-1's `chat.reply` key `key`, its inputs bound to the key.
pub fn new_task(key: &str) -> NewTask {
    NewTask::new(
        RequestKey::new("user-1", "chat.reply", key),
        InputHash::of(["m", key]),
    )
}
