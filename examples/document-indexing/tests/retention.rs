//! After taskfence's dedup record expires, a replayed upload is new work: the
//! unique entry key and the forward-only version keep it harmless.
mod common;

use std::time::Duration;

use common::{Harness, LEASE, V1, V2, expected_visible};
use document_indexing::{Error, Indexed, chunk};
use taskfence::TaskStore;

#[tokio::test]
async fn a_replay_after_the_dedup_window_adds_no_entries_and_changes_nothing_visible() {
    let retention = Duration::from_secs(60);
    let h = Harness::with(|indexer| indexer.retention(retention)).await;
    let first = h.upload_and_index("plan", 1, V1).await;
    let Indexed::Done { task: first, .. } = first else {
        unreachable!()
    };
    h.upload_and_index("plan", 2, V2).await;

    h.advance(retention + Duration::from_secs(1)).await;
    assert_eq!(h.indexer.store().purge_expired(100).await.unwrap(), 2);

    // The replay is a new task (documented: the window is over)…
    let replay = h.indexer.upload("plan", 1, V1).await.unwrap();
    assert!(replay.created);
    assert_ne!(replay.task.id, first.id);
    // …whose run inserts nothing (same (document, version, chunk) keys) and
    // cannot move the document back to v1.
    let outcome = h
        .indexer
        .index_once("worker-b", replay.task.id, LEASE)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            Indexed::Done {
                entries_written: 0,
                became_current: false,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.visible("plan").await, expected_visible(2, V2));

    // Other bytes for v1 are still refused: the app's own version record outlives the window.
    let err = h
        .indexer
        .upload("plan", 1, "Rewritten history.")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::VersionConflict { version: 1, .. }), "{err}");
}
