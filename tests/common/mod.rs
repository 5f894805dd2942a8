//! Helpers of the library's own tests; what other crates share too lives in
//! `taskfence-test-support`.
#![allow(dead_code, unused_imports)] // each test binary uses a part

pub(crate) use taskfence_test_support::*;

use std::time::Duration;

use taskfence::{Claim, ClaimRequest, InputHash, Lease, NewTask, RequestKey, TaskId, TaskStore};

/// A submission under user-1's `chat.reply` key `key`, its inputs bound to the key.
pub(crate) fn new_task(key: &str) -> NewTask {
    NewTask::new(
        RequestKey::new("user-1", "chat.reply", key),
        InputHash::of(["m", key]),
    )
}

/// Claims `id` for worker `w` with a 60 s lease; panics unless it was acquired.
pub(crate) async fn acquire<S: TaskStore + ?Sized>(store: &S, id: TaskId) -> Lease {
    match store
        .claim(id, ClaimRequest::new("w", Duration::from_secs(60)))
        .await
        .unwrap()
    {
        Claim::Acquired(lease) => lease,
        other => panic!("claim of {id}: {other:?}"),
    }
}
