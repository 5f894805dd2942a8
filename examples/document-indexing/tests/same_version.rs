//! What counts as the same work: (document, version, stage), bound to the content.
mod common;

use common::{Harness, LEASE, V1, V2, expected_visible};
use document_indexing::{Error, Indexed, chunk};
use taskfence::error::InvalidInput;
use taskfence::testing::Fixture;
use taskfence::{Status, TaskStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_version_uploaded_three_times_is_one_task_and_one_set_of_entries() {
    let h = Harness::new().await;
    let i = &h.indexer;
    // Three uploads of the same version at once (a client retrying).
    let (a, b, c) = tokio::join!(
        i.upload("plan", 1, V1),
        i.upload("plan", 1, V1),
        i.upload("plan", 1, V1)
    );
    let uploads = [a.unwrap(), b.unwrap(), c.unwrap()];
    assert!(uploads.iter().all(|u| u.task.id == uploads[0].task.id));
    assert_eq!(uploads.iter().filter(|u| u.created).count(), 1);
    assert_eq!(h.fixture.count("tasks").await, 1);
    assert_eq!(h.fixture.count("handoffs").await, 1);
    assert_eq!(h.app_rows("document_versions").await, 1);

    let task = uploads[0].task.id;
    let Indexed::Done {
        entries_written,
        became_current,
        ..
    } = i.index_once("worker-a", task, LEASE).await.unwrap()
    else {
        panic!("the first delivery indexes")
    };
    assert_eq!(entries_written, chunk(V1).len() as u64);
    assert!(became_current);

    // Duplicate deliveries and a late retry of the upload: nothing new.
    for worker in ["worker-b", "worker-c"] {
        let again = i.index_once(worker, task, LEASE).await.unwrap();
        assert!(
            matches!(again, Indexed::AlreadyDone(ref t) if t.id == task),
            "{again:?}"
        );
    }
    let late = i.upload("plan", 1, V1).await.unwrap();
    assert!(!late.created);
    assert_eq!(late.task.status, Status::Completed);

    assert_eq!(h.stored_entries("plan", 1).await, chunk(V1));
    assert_eq!(h.app_rows("index_entries").await, chunk(V1).len() as i64);
    assert_eq!(h.visible("plan").await, expected_visible(1, V1));
    assert_eq!(h.fixture.count("tasks").await, 1);
    assert_eq!(
        i.store().attempts(task).await.unwrap().len(),
        1,
        "duplicates start no attempt"
    );
}

#[tokio::test]
async fn a_new_version_is_new_work() {
    let h = Harness::new().await;
    let v1 = h.indexer.upload("plan", 1, V1).await.unwrap();
    let v2 = h.indexer.upload("plan", 2, V2).await.unwrap();
    assert!(v1.created && v2.created);
    assert_ne!(v1.task.id, v2.task.id);
    // The same bytes as a new version are new work too: identity is the version, not the content.
    let v3 = h.indexer.upload("plan", 3, V1).await.unwrap();
    assert!(v3.created);
    assert_eq!(h.fixture.count("tasks").await, 3);
}

#[tokio::test]
async fn the_same_version_with_other_bytes_is_a_conflict_and_writes_nothing() {
    let h = Harness::new().await;
    let first = h.indexer.upload("plan", 1, V1).await.unwrap();
    let before = (
        h.fixture.record_count().await,
        h.app_rows("document_versions").await,
    );

    let err = h.indexer.upload("plan", 1, V2).await.unwrap_err();
    assert!(
        matches!(err, Error::VersionConflict { ref document, version: 1 } if document == "plan"),
        "{err}"
    );
    assert_eq!(
        (
            h.fixture.record_count().await,
            h.app_rows("document_versions").await
        ),
        before
    );

    // The original stays the work of version 1, and indexing it indexes V1.
    h.indexer
        .index_once("worker-a", first.task.id, LEASE)
        .await
        .unwrap();
    assert_eq!(h.visible("plan").await, expected_visible(1, V1));
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let h = Harness::new().await;
    let long = "d".repeat(document_indexing::MAX_DOCUMENT_LEN + 1);
    let cases: [(&str, i64, &str); 7] = [
        ("", 1, V1),
        (" ", 1, V1),
        (&long, 1, V1),
        ("plan\0", 1, V1),
        ("plan", 0, V1),
        ("plan", 1, " \n\n "),
        ("plan", 1, "text with a NUL \0 byte"),
    ];
    for (document, version, body) in cases {
        let err = h.indexer.upload(document, version, body).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput(_)),
            "{document:?} v{version}: {err}"
        );
    }
    let Err(Error::InvalidInput(InvalidInput::OutOfRange { field, .. })) =
        h.indexer.upload("plan", -1, V1).await
    else {
        panic!("a negative version is out of range")
    };
    assert_eq!(field, "version");
    assert!(matches!(
        document_indexing::Indexer::new(h.indexer.store().clone(), "Robert'); DROP"),
        Err(Error::InvalidInput(InvalidInput::NotAnIdentifier {
            field: "schema"
        }))
    ));

    assert_eq!(h.fixture.record_count().await, 0);
    assert_eq!(h.app_rows("documents").await, 0);
    assert_eq!(h.app_rows("document_versions").await, 0);
}

#[tokio::test]
async fn a_task_that_is_not_ours_is_failed_permanently_and_writes_nothing() {
    let h = Harness::new().await;
    let foreign = taskfence::NewTask::new(
        taskfence::RequestKey::new("user-1", "chat.reply", "req-1"),
        taskfence::InputHash::of(["message-1"]),
    );
    let task = h.indexer.store().submit(foreign).await.unwrap().into_task().id;
    let err = h.indexer.index_once("worker-a", task, LEASE).await.unwrap_err();
    assert!(matches!(err, Error::NotAnIndexingTask(id) if id == task), "{err}");
    assert_eq!(h.status(task).await, Status::Failed, "no retry could succeed");
    assert_eq!(h.app_rows("index_entries").await, 0);
    assert_eq!(h.app_rows("documents").await, 0);
}
