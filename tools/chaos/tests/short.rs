//! The chaos harness in its short mode: 200 tasks, 3 worker processes, every
//! fault kind injected for real at least once (SIGKILL mid-call, SIGSTOP past
//! the lease, pg_terminate_backend, a PostgreSQL restart), then the checker.
//!
//! It runs on a private PostgreSQL cluster the harness creates (initdb), not on
//! the shared `DATABASE_URL` server: restarting that one would break every
//! other test running in parallel. See docs/RELIABILITY.md.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The orchestrator process; stopped on drop (also when an assertion panics):
/// SIGTERM first, so it stops its workers and its private server itself.
struct Orchestrator(Child);

impl Drop for Orchestrator {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `PREFIX name value` lines of the orchestrator's output.
fn counts(output: &str, prefix: &str) -> HashMap<String, i64> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|l| {
            let (name, value) = l.trim().rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The two runs each start a PostgreSQL cluster and workers of their own:
/// one at a time.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One short chaos run (its workers' store calls recorded in `traces` when
/// given), checked: every fault injected, every must-be-zero count zero, all
/// 200 tasks submitted, a clean result.
fn short_run(traces: Option<&std::path::Path>) {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
    if let Some(traces) = traces {
        command.arg("--trace-dir").arg(traces);
    }
    let child = command
        .args(["--worker-bin", env!("CARGO_BIN_EXE_chaos-worker")])
        .args(["--tasks", "200", "--workers", "3", "--concurrency", "4"])
        .args([
            "--lease-ms",
            "1500",
            "--submit-secs",
            "30",
            "--fault-every-ms",
            "1500",
        ])
        .args(["--restarts", "1", "--drain-secs", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the chaos orchestrator");
    let mut orchestrator = Orchestrator(child);
    let mut output = String::new();
    orchestrator
        .0
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut output)
        .expect("read the report");
    let status = orchestrator.0.wait().expect("orchestrator exit");
    println!("{output}");

    let faults = counts(&output, "FAULT ");
    for kind in [
        "sigkill_mid-call",
        "sigstop_past_the_lease",
        "pg_terminate_backend",
        "postgresql_restart",
    ] {
        assert!(
            faults.get(kind).copied().unwrap_or(0) >= 1,
            "fault {kind} was not injected: {faults:?}"
        );
    }
    let zeros = counts(&output, "ZERO ");
    assert_eq!(
        zeros.len(),
        5,
        "the checker reported every must-be-zero count: {zeros:?}"
    );
    for (name, n) in &zeros {
        assert_eq!(*n, 0, "{name} must be 0");
    }
    assert!(
        output.contains("| tasks submitted | 200 |"),
        "all 200 tasks submitted"
    );
    assert!(output.contains("RESULT clean"));
    assert!(status.success(), "orchestrator exited with {status}");
}

#[test]
fn short_chaos_run_loses_nothing_and_saves_one_response_per_task() {
    // Workers racing each other at the store, unrecorded.
    short_run(None);
}

#[test]
fn short_chaos_runs_history_replays_against_the_model() {
    // Every worker's store calls, recorded there (one call at a time across
    // the processes, so the merged order is the store's) and replayed.
    let traces = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("chaos-traces");
    let _ = std::fs::remove_dir_all(&traces);
    std::fs::create_dir_all(&traces).expect("the trace directory");
    short_run(Some(&traces));

    // The workers' histories, merged into the order the store saw, replay
    // against the model step by step.
    let merged = chaos::trace::merge(&traces).expect("the workers' traces merge");
    let cut = merged.steps.iter().filter(|s| s.outcome == "unknown").count();
    let replayed = model_check::replay::replay(&merged.steps)
        .unwrap_or_else(|why| panic!("the chaos run's history ({}): {why}", traces.display()));
    println!(
        "trace: {} worker files, {replayed} steps replayed ({} cut short by a kill, {cut} unknown in all)",
        merged.files, merged.cut_short
    );
    assert!(merged.files >= 3, "every worker wrote its trace");
    let tasks: std::collections::HashSet<_> = merged.steps.iter().filter_map(|s| s.task_id).collect();
    assert_eq!(tasks.len(), 200, "every task's claims are in the history");

    // The replay bites on the merged history too: a delivery that found its
    // task completed (every task is delivered twice) shown as a new lease.
    let mut tampered = merged.steps.clone();
    let i = tampered
        .iter()
        .position(|s| s.op == "claim" && s.outcome == "completed")
        .expect("a claim that found its task completed");
    let step = &mut tampered[i];
    step.outcome = "acquired".to_owned();
    let lease = step.duration.unwrap_or_default();
    let seen = &mut step.tasks[0];
    let mut taken = seen.before.clone().expect("the task");
    taskfence::backend::rules::taken(&mut taken, time::OffsetDateTime::now_utc() + lease);
    seen.after = Some(taken);
    let why = model_check::replay::replay(&tampered).expect_err("a tampered history must not replay");
    println!("tampered: {why}");
    assert!(why.contains(&format!("step {i} (claim")), "{why}");
    assert!(why.contains("the store granted assignment"), "{why}");
}
