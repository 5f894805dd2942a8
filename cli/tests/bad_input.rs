//! Bad input: one line on stderr, the documented exit code, nothing on
//! stdout, nothing written.

mod common;

use common::{failed, fixture, pg, run, taskfence};
use taskfence::TaskId;
use taskfence::testing::Fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_not_found() {
    let f = fixture().await;
    failed(&*f.store(), "t", "k", "boom").await;
    let before = f.record_count().await;
    let unknown = TaskId::new().to_string();
    for args in [
        vec!["show", unknown.as_str()],
        vec!["reopen", unknown.as_str(), "--reason", "why"],
        vec![
            "reopen",
            unknown.as_str(),
            "--reason",
            "why",
            "--max-attempts",
            "2",
        ],
        vec!["cancel", unknown.as_str(), "--reason", "why"],
    ] {
        let line = pg(&f, &args).failed(3).to_owned();
        assert!(line.contains(&unknown) && line.contains("not found"), "{line}");
    }
    assert_eq!(f.record_count().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_values_are_usage_errors() {
    let f = fixture().await;
    let task = failed(&*f.store(), "t", "k", "boom").await;
    let id = task.id.to_string();
    let before = f.record_count().await;
    for (args, says) in [
        (vec!["show", "not-a-uuid"], "not a task id"),
        (
            vec!["show", "--key", "scope/operation"],
            "expected scope/operation/key",
        ),
        (vec!["show", "--key", "scope//key"], "operation is empty"),
        (vec!["list", "--older-than", "5 fortnights"], "not a duration"),
        (vec!["list", "--newer-than", "0s"], "positive"),
        (vec!["list", "--status", "done"], "invalid value 'done'"),
        (vec!["list", "--limit", "0"], "--limit"),
        (vec!["list", "--after", "x"], "not a cursor"),
        (vec!["stranded", "--older-than", "soon"], "not a duration"),
        (vec!["reopen", id.as_str(), "--reason", " "], "must not be blank"),
        (
            vec!["reopen", id.as_str(), "--reason", "x", "--deadline", "400d"],
            "more than the limit",
        ),
        (
            vec!["reopen", id.as_str(), "--reason", "x", "--max-attempts", "0"],
            "--max-attempts",
        ),
        (vec!["reopen", id.as_str()], "--reason"),
        (vec!["frobnicate"], "unrecognized subcommand"),
    ] {
        let out = pg(&f, &args);
        let line = out.failed(2);
        assert!(line.contains(says), "{args:?}: {line}");
    }
    // A bad schema name is refused before any query.
    let bad_schema = run(taskfence()
        .args(["--database-url", f.url(), "--schema", "Robert'); DROP TABLE"])
        .arg("stats"));
    assert!(bad_schema.failed(2).contains("schema"), "{bad_schema:#?}");
    assert_eq!(f.record_count().await, before);
    assert_eq!(f.store().get(task.id).await.unwrap().unwrap(), task);
}

#[test]
fn an_unreachable_store_is_an_operational_error_on_one_line() {
    // A port nothing listens on: bind one, note it, free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let out = run(taskfence().args(["--database-url", &url, "stats"]));
    let line = out.failed(1);
    assert!(
        line.contains("cannot connect to PostgreSQL at 127.0.0.1"),
        "{line}"
    );
}

#[test]
fn a_malformed_url_or_no_store_is_a_usage_error() {
    let out = run(taskfence().args(["--database-url", "mysql:/nope", "stats"]));
    assert!(out.failed(2).contains("--database-url"), "{out:#?}");
    let none = run(taskfence().arg("stats"));
    assert!(none.failed(2).contains("no store"), "{none:#?}");
}

#[test]
fn help_and_version_succeed() {
    let help = run(taskfence().arg("--help"));
    assert!(help.ok().contains("Exit codes:"), "{help:#?}");
    let version = run(taskfence().arg("--version"));
    assert!(version.ok().starts_with("taskfence "), "{version:#?}");
}
