//! Former command names against the real PostgreSQL: `retry` still reopens
//! a failed task and `dispatch-due` still prints the due ids, each with a
//! deprecation warning naming the new command and the release that removes
//! the old one; an unknown `TASKFENCE_*` variable is reported, not ignored.

mod common;

use common::{failed, fixture, pg};
use taskfence::Status;
use taskfence::testing::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_still_reopens_a_failed_task_with_a_warning() {
    let f = fixture().await;
    let task = failed(&*f.store(), "tenant-a", "k1", "boom").await;
    let run = pg(&f, &["retry", &task.id.to_string(), "--reason", "fixed upstream"]);
    let out = run.ok();
    assert!(
        out.starts_with(&format!("reopened task {}: pending", task.id)),
        "{run:#?}"
    );
    assert_eq!(
        run.stderr,
        "taskfence: warning: `taskfence retry` is deprecated and will be removed in 0.3: \
         use `taskfence reopen` (the same arguments)\n"
    );
    let now = f.store().get(task.id).await.unwrap().unwrap();
    assert_eq!(now.status, Status::Pending, "reopened");
    // The current name: the same, without the warning.
    let again = failed(&*f.store(), "tenant-a", "k2", "boom").await;
    let run = pg(
        &f,
        &["reopen", &again.id.to_string(), "--reason", "fixed upstream"],
    );
    run.ok();
    assert_eq!(run.stderr, "", "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_due_still_prints_the_due_ids_with_a_warning() {
    let f = fixture().await;
    let run = pg(&f, &["dispatch-due", "--print"]);
    run.ok();
    assert!(
        run.stderr.contains(
            "`taskfence dispatch-due` is deprecated and will be removed in 0.3: use `taskfence republish-due`"
        ),
        "{run:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_variable_is_reported_and_the_command_still_runs() {
    let f = fixture().await;
    let run = common::run(
        common::taskfence()
            .env("TASKFENCE_SCHEME", "elsewhere")
            .env("TASKFENCE_NOT_A_SETTING", "1")
            .args(["--database-url", f.url(), "--schema", f.schema(), "stats"]),
    );
    run.ok();
    assert_eq!(
        run.stderr,
        "taskfence: warning: unknown environment variables, ignored: TASKFENCE_NOT_A_SETTING, \
         TASKFENCE_SCHEME (did you mean TASKFENCE_SCHEMA?)\n"
    );
}
