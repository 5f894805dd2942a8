//! What the end-to-end tests share: running the built `taskfence` binary
//! against one store, and setting tasks up with the library's API.
#![allow(dead_code)] // each test file uses its own part

use std::process::{Command, Output};

use taskfence::testing::{PgFixture, acquire};
use taskfence::{Failure, InputHash, NewTask, RequestKey, Response, RetryPolicy, Task, TaskStore};

/// The outcome of one run of the binary.
#[derive(Debug)]
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    #[track_caller]
    pub(crate) fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success, got {self:#?}");
        &self.stdout
    }

    /// Asserts exit `code`, nothing on stdout and exactly one line on
    /// stderr, `taskfence: error: …`; returns that line.
    #[track_caller]
    pub(crate) fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "expected exit {code}, got {self:#?}");
        assert_eq!(self.stdout, "", "nothing on stdout on failure: {self:#?}");
        let line = self.stderr.strip_suffix('\n').unwrap_or(&self.stderr);
        assert!(!line.contains('\n'), "one line on stderr: {self:#?}");
        assert!(line.starts_with("taskfence: error: "), "{self:#?}");
        line
    }

    /// Stdout as JSON.
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.ok()).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }
}

/// The binary with a clean environment for the store flags: each test says
/// which store it means.
pub(crate) fn taskfence() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskfence"));
    for var in [
        "DATABASE_URL",
        "DATABASE_URL_FILE",
        "TASKFENCE_WEB_TOKEN",
        "TASKFENCE_WEB_TOKEN_FILE",
        "TASKFENCE_SCHEMA",
        "TASKFENCE_DYNAMODB_TABLE",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "RUST_BACKTRACE",
    ] {
        cmd.env_remove(var);
    }
    // Whatever else of taskfence's the test's environment holds (the test
    // kit's endpoints): the binary would report each as unknown.
    for (var, _) in std::env::vars_os() {
        if var.to_str().is_some_and(|v| v.starts_with("TASKFENCE_")) {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// Runs `cmd` to completion.
pub(crate) fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run the taskfence binary");
    Run {
        code: status.code().expect("exited, not killed"),
        stdout: String::from_utf8(stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(stderr).expect("UTF-8 stderr"),
    }
}

/// Runs the binary on the fixture's schema with `args`.
pub(crate) fn pg(fixture: &PgFixture, args: &[&str]) -> Run {
    run(taskfence()
        .args(["--database-url", fixture.url(), "--schema", fixture.schema()])
        .args(args))
}

/// A fresh fixture (own migrated schema) on the test server.
pub(crate) async fn fixture() -> PgFixture {
    taskfence_test_support::fixture().await
}

/// Submits `scope/operation/key` with `policy`.
pub(crate) async fn submit(
    store: &dyn TaskStore,
    scope: &str,
    operation: &str,
    key: &str,
    policy: RetryPolicy,
) -> Task {
    store
        .submit(NewTask::new(RequestKey::new(scope, operation, key), InputHash::of([key])).policy(policy))
        .await
        .expect("submit")
        .into_task()
}

/// A task that failed terminally: one attempt allowed, a retryable failure.
pub(crate) async fn failed(store: &dyn TaskStore, scope: &str, key: &str, error: &str) -> Task {
    let task = submit(
        store,
        scope,
        "chat.reply",
        key,
        RetryPolicy::default().max_attempts(1),
    )
    .await;
    let lease = acquire(store, task.id, "worker-1").await;
    let _ = store.fail(lease, Failure::retryable(error)).await.expect("fail");
    store.get(task.id).await.expect("get").expect("known")
}

/// A completed task.
pub(crate) async fn completed(store: &dyn TaskStore, scope: &str, key: &str) -> Task {
    let task = submit(store, scope, "chat.reply", key, RetryPolicy::default()).await;
    let lease = acquire(store, task.id, "worker-1").await;
    store
        .complete(lease, Response::from("hello"))
        .await
        .expect("complete")
        .accepted()
        .expect("the only lease saves")
}
