//! Child processes for the multi-process tests: the test binary runs
//! itself again, filtered to one test, with the role in the environment.
//! A test that finds its role there plays it and exits; otherwise it is the
//! parent that started them.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The environment variable holding a child's role.
pub(crate) const ROLE: &str = "TASKFENCE_SQLITE_CHILD_ROLE";
/// The environment variable holding the database file a child opens.
pub(crate) const FILE: &str = "TASKFENCE_SQLITE_CHILD_FILE";

/// The role this process was started in, with its file: `None` in the parent.
pub(crate) fn role() -> Option<(String, String)> {
    Some((std::env::var(ROLE).ok()?, std::env::var(FILE).ok()?))
}

/// Starts this test binary again, running only `test` (its full path), in `role` on `file`.
pub(crate) fn spawn(test: &str, role: &str, file: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .env(FILE, file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a child process")
}

/// Waits for `child` (off the runtime's threads) and returns its stdout;
/// panics with its output when it failed.
pub(crate) async fn finish(child: Child, name: &str) -> String {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("wait for the child")
        .expect("the child's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of `name=` on the line of `stdout` that reports it.
pub(crate) fn reported(stdout: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in the child's output:\n{stdout}"))
}
