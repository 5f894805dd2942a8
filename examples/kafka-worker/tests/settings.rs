//! The service binary at start-up: a former option's variable still works
//! and is reported with its replacement, and `TASKFENCE_*` variables no
//! option reads are reported, not silently ignored. No broker or database:
//! the URL does not parse, so the service stops right after the warnings.

use std::process::Command;

#[test]
fn former_and_unknown_variables_are_reported_at_start_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-worker"))
        .env_clear()
        .env("TASKFENCE_PER_PARTITION", "3")
        .env("TASKFENCE_CONCURENCY", "2")
        .env("TASKFENCE_NOT_A_SETTING", "x")
        .args(["--database-url", "not a url", "--bootstrap", "127.0.0.1:1"])
        .args(["--provider", "simulated"])
        .output()
        .expect("the service runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the URL is refused:\n{text}");
    for expected in [
        "`--per-partition / TASKFENCE_PER_PARTITION` is deprecated and will be removed in 0.3: \
         use `--concurrency / TASKFENCE_CONCURRENCY`",
        "read as --concurrency 3",
        "unknown environment variables, ignored: TASKFENCE_CONCURENCY (did you mean \
         TASKFENCE_CONCURRENCY?), TASKFENCE_NOT_A_SETTING",
    ] {
        assert!(text.contains(expected), "{expected:?} in:\n{text}");
    }
    let warnings = text.lines().filter(|l| l.contains(" WARN ")).count();
    assert_eq!(warnings, 2, "one line each:\n{text}");
}

#[test]
fn a_clean_environment_gets_no_warning() {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-worker"))
        .env_clear()
        .env("TASKFENCE_CONCURRENCY", "2")
        .args(["--database-url", "not a url", "--bootstrap", "127.0.0.1:1"])
        .args(["--provider", "simulated"])
        .output()
        .expect("the service runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(" WARN "), "{text}");
}
