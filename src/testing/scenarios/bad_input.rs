//! Guarantee 11: bad input gets a typed error and writes nothing.

use std::time::Duration;

use super::*;
use crate::error::Error;
use crate::limits;
use crate::policy::{Failure, RetryPolicy};
use crate::store::{ClaimRequest, Fenced, Rejection};
use crate::task::{InputHash, NewTask, RequestKey, Response, Task};
use crate::testing::{Fixture, forged_lease};

/// Guarantee 11: the bad-input catalogue. Each gets a typed error, and nothing is written.
pub async fn bad_input_is_rejected_and_writes_nothing(f: &dyn Fixture) {
    let store = f.store();
    let long = |n: usize| "k".repeat(n + 1);
    let hash = InputHash::of(["x"]);
    let with_key = |scope: &str, op: &str, k: &str| NewTask::new(RequestKey::new(scope, op, k), hash);
    let bad_submissions: Vec<(&str, NewTask)> = vec![
        ("empty key", with_key("s", "op", "")),
        ("whitespace key", with_key("s", "op", " \t ")),
        ("oversized key", with_key("s", "op", &long(limits::MAX_KEY_LEN))),
        ("NUL in key", with_key("s", "op", "a\0b")),
        ("control character in key", with_key("s", "op", "a\u{1b}[31m")),
        ("empty scope", with_key("", "op", "k")),
        (
            "oversized scope",
            with_key(&long(limits::MAX_SCOPE_LEN), "op", "k"),
        ),
        ("NUL in scope", with_key("s\0", "op", "k")),
        ("empty operation", with_key("s", "", "k")),
        (
            "oversized operation",
            with_key("s", &long(limits::MAX_OPERATION_LEN), "k"),
        ),
        ("NUL in operation", with_key("s", "o\0p", "k")),
        (
            "oversized payload",
            new_task("k").payload(vec![0u8; limits::MAX_PAYLOAD_LEN + 1]),
        ),
        ("zero retention", new_task("k").retention(Duration::ZERO)),
        ("absurd retention", new_task("k").retention(Duration::MAX)),
        (
            "max_attempts = 0",
            new_task("k").policy(RetryPolicy::default().max_attempts(0)),
        ),
        (
            "huge max_attempts",
            new_task("k").policy(RetryPolicy::default().max_attempts(u32::MAX)),
        ),
        (
            "zero initial backoff",
            new_task("k").policy(RetryPolicy::default().initial_backoff(Duration::ZERO)),
        ),
        (
            "absurd max backoff",
            new_task("k").policy(RetryPolicy::default().max_backoff(Duration::MAX)),
        ),
        (
            "zero deadline",
            new_task("k").policy(RetryPolicy::default().deadline(Duration::ZERO)),
        ),
        (
            "absurd deadline",
            new_task("k").policy(RetryPolicy::default().deadline(Duration::MAX)),
        ),
        (
            "NaN multiplier",
            new_task("k").policy(RetryPolicy::default().multiplier(f64::NAN)),
        ),
        (
            "shrinking multiplier",
            new_task("k").policy(RetryPolicy::default().multiplier(0.5)),
        ),
        (
            "jitter above 1",
            new_task("k").policy(RetryPolicy::default().jitter(2.0)),
        ),
        (
            "negative jitter",
            new_task("k").policy(RetryPolicy::default().jitter(-0.5)),
        ),
    ];
    let records = f.record_count().await;
    for (what, bad) in bad_submissions {
        let err = store.submit(bad).await.expect_err(what);
        assert!(
            matches!(err, Error::InvalidInput(_)),
            "{what}: expected InvalidInput, got {err:?}"
        );
        assert_eq!(f.record_count().await, records, "{what}: nothing written");
    }
    assert!(
        matches!(
            store.find(&RequestKey::new("s", "op", "a\0b")).await,
            Err(Error::InvalidInput(_))
        ),
        "find with NUL"
    );

    // Bad input on a live task leaves it exactly as it was.
    let t = submit(&*store, new_task("valid")).await;
    let records = f.record_count().await;
    for (what, req) in [
        ("blank worker", ClaimRequest::new(" ", LEASE)),
        ("NUL worker", ClaimRequest::new("w\0", LEASE)),
        ("zero lease", ClaimRequest::new("w", Duration::ZERO)),
        ("absurd lease", ClaimRequest::new("w", Duration::MAX)),
        (
            "lease beyond the limit",
            ClaimRequest::new("w", limits::MAX_LEASE + Duration::from_secs(1)),
        ),
    ] {
        let err = store.claim(t.id, req).await.expect_err(what);
        assert!(matches!(err, Error::InvalidInput(_)), "{what}: {err:?}");
    }
    assert_eq!(f.record_count().await, records, "refused claims write nothing");
    assert_eq!(
        task(&*store, t.id).await,
        t,
        "refused claims leave the task as it was"
    );

    let mut lease = acquire(&*store, t.id, "w").await;
    let snapshot = task(&*store, t.id).await;
    let records = f.record_count().await;
    let invalid = |r: Result<Fenced<()>, Error>| matches!(r, Err(Error::InvalidInput(_)));
    assert!(
        invalid(store.renew(&mut lease, Duration::ZERO).await),
        "zero renewal"
    );
    assert!(
        invalid(store.renew(&mut lease, Duration::MAX).await),
        "absurd renewal"
    );
    assert!(
        invalid(store.record_operation(&lease, "").await),
        "empty operation id"
    );
    assert!(
        invalid(store.record_operation(&lease, "op\0").await),
        "NUL operation id"
    );
    assert!(
        invalid(
            store
                .record_operation(&lease, &long(limits::MAX_OPERATION_ID_LEN))
                .await
        ),
        "oversized operation id"
    );
    let oversized = Response::new(vec![b'x'; limits::MAX_RESPONSE_LEN + 1]);
    assert!(
        matches!(
            store.complete(lease.clone(), oversized).await,
            Err(Error::InvalidInput(_))
        ),
        "oversized response"
    );
    assert!(
        matches!(
            store.fail(lease.clone(), Failure::retryable("a\0b")).await,
            Err(Error::InvalidInput(_))
        ),
        "NUL failure message"
    );
    assert!(
        matches!(store.cancel(t.id, "why\0").await, Err(Error::InvalidInput(_))),
        "NUL cancel reason"
    );
    assert!(
        matches!(store.due(0).await, Err(Error::InvalidInput(_))),
        "due(0)"
    );
    assert!(
        matches!(store.purge_expired(0).await, Err(Error::InvalidInput(_))),
        "purge_expired(0)"
    );
    assert_eq!(f.record_count().await, records, "refused writes add nothing");
    assert_eq!(
        task(&*store, t.id).await,
        snapshot,
        "refused writes change nothing"
    );
    assert_eq!(store.attempts(t.id).await.unwrap()[0].operation_id, None);

    // A forged version is refused like any stale one.
    let forged = forged_lease(
        Task {
            version: 99,
            ..snapshot.clone()
        },
        &lease,
    );
    assert_eq!(
        store
            .complete(forged, Response::from("forged"))
            .await
            .unwrap()
            .rejection(),
        Some(&Rejection::Superseded { current_version: 1 })
    );
    assert_eq!(task(&*store, t.id).await, snapshot);
}
