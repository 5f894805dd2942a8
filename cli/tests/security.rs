//! Secrets and bounds on the command line: ages past the date range are
//! usage errors, secrets come from files or the environment (a warning when
//! they come from argv), `web` warns when it listens beyond loopback and
//! refuses a predictable token.

mod common;

use common::{fixture, pg, run, taskfence};

/// A PostgreSQL URL nothing listens at: the command gets past its checks
/// and warnings, then fails to connect (exit 1).
const NOWHERE: &str = "postgres://postgres@127.0.0.1:1/x";

/// A file under the temporary directory holding `text`.
fn secret_file(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("taskfence-secret-{}", taskfence::TaskId::new()));
    std::fs::write(&path, text).unwrap();
    path
}

fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("taskfence: warning: "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_ages_are_usage_errors_not_a_panic() {
    let f = fixture().await;
    for args in [
        vec!["list", "--older-than", "100000000y"],
        vec!["list", "--newer-than", "100000000y"],
        vec!["list", "--older-than", "101y"],
        vec!["stranded", "--older-than", "100000000y"],
    ] {
        let out = pg(&f, &args);
        let line = out.failed(2);
        assert!(line.contains("out of range"), "{args:?}: {line}");
    }
    pg(&f, &["list", "--older-than", "36500d"]).ok();
}

#[test]
fn secrets_on_the_command_line_are_warned_about() {
    // A password in --database-url: warned about, never echoed.
    let out = run(taskfence().args([
        "--database-url",
        "postgres://postgres:hunter2@127.0.0.1:1/x",
        "stats",
    ]));
    assert_eq!(out.code, 1, "{out:#?}");
    assert!(
        warnings(&out.stderr)
            .iter()
            .any(|w| w.contains("--database-url holds a password")),
        "{out:#?}"
    );
    assert!(!out.stderr.contains("hunter2"), "{out:#?}");
    // Without a password it is no secret: no warning.
    let out = run(taskfence().args(["--database-url", NOWHERE, "stats"]));
    assert_eq!((out.code, warnings(&out.stderr).len()), (1, 0), "{out:#?}");
    // The action token on the command line, and an address beyond loopback.
    let token = "cli-test-token-0123456789";
    let out = run(taskfence().env_remove("TASKFENCE_WEB_TOKEN").args([
        "--database-url",
        NOWHERE,
        "web",
        "--action-token",
        token,
        "--listen",
        "0.0.0.0:0",
    ]));
    assert_eq!(out.code, 1, "{out:#?}");
    let said = warnings(&out.stderr);
    assert!(
        said.iter()
            .any(|w| w.contains("--action-token on the command line")),
        "{out:#?}"
    );
    assert!(
        said.iter().any(|w| w.contains("not a loopback address")),
        "{out:#?}"
    );
    assert!(!out.stderr.contains(token), "{out:#?}");
    // From the environment, on loopback: nothing to warn about.
    let out = run(taskfence().env("TASKFENCE_WEB_TOKEN", token).args([
        "--database-url",
        NOWHERE,
        "web",
        "--listen",
        "127.0.0.1:0",
    ]));
    assert_eq!((out.code, warnings(&out.stderr).len()), (1, 0), "{out:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_read_from_files() {
    let f = fixture().await;
    // The URL from a file, with the newline an editor leaves.
    let url_file = secret_file(&format!("{}\n", f.url()));
    let out =
        run(taskfence()
            .arg("--database-url-file")
            .arg(&url_file)
            .args(["--schema", f.schema(), "stats"]));
    out.ok();
    assert!(warnings(&out.stderr).is_empty(), "{out:#?}");
    // The token from a file: read (and checked) before anything connects.
    let weak = secret_file("aaaaaaaaaaaaaaaa\n");
    let out = run(taskfence()
        .env_remove("TASKFENCE_WEB_TOKEN")
        .args(["--database-url", NOWHERE, "web", "--action-token-file"])
        .arg(&weak));
    assert!(out.failed(2).contains("too predictable"), "{out:#?}");
    let missing = std::env::temp_dir().join("taskfence-no-such-secret");
    let out = run(taskfence()
        .env_remove("TASKFENCE_WEB_TOKEN")
        .args(["--database-url", NOWHERE, "web", "--action-token-file"])
        .arg(&missing));
    assert!(out.failed(2).contains("cannot read it"), "{out:#?}");
    for file in [url_file, weak] {
        let _ = std::fs::remove_file(file);
    }
}

#[test]
fn web_refuses_a_predictable_token() {
    for token in ["aaaaaaaaaaaaaaaa", "abababababababababab"] {
        let out = run(taskfence()
            .env("TASKFENCE_WEB_TOKEN", token)
            .args(["--database-url", NOWHERE, "web"]));
        // Refused before connecting (nothing listens on that port).
        assert!(out.failed(2).contains("too predictable"), "{token}: {out:#?}");
    }
}
