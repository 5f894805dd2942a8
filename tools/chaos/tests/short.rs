//! The chaos harness in its short mode: 200 tasks, 3 worker processes, every
//! fault kind injected for real at least once (SIGKILL mid-call, SIGSTOP past
//! the lease, pg_terminate_backend, a PostgreSQL restart), then the checker.
//! And the limits mode (`--limits`): 150 tasks naming concurrency keys and a
//! rate bucket, the same faults, and each key's most calls in flight and the
//! bucket's most claims per period checked against their limits.
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

/// Runs the orchestrator with `args` to its end: its report and exit status.
fn run_orchestrator(args: &[&str]) -> (String, std::process::ExitStatus) {
    let child = Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["--worker-bin", env!("CARGO_BIN_EXE_chaos-worker")])
        .args(args)
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
    (output, status)
}

/// Every fault kind was injected, the `expected` must-be-zero counts were
/// all reported and are 0, all `tasks` were submitted, the result is clean.
fn assert_clean(output: &str, status: std::process::ExitStatus, expected: usize, tasks: u32) {
    let faults = counts(output, "FAULT ");
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
    let zeros = counts(output, "ZERO ");
    assert_eq!(
        zeros.len(),
        expected,
        "the checker reported every must-be-zero count: {zeros:?}"
    );
    for (name, n) in &zeros {
        assert_eq!(*n, 0, "{name} must be 0");
    }
    assert!(
        output.contains(&format!("| tasks submitted | {tasks} |")),
        "all {tasks} tasks submitted"
    );
    assert!(output.contains("RESULT clean"));
    assert!(status.success(), "orchestrator exited with {status}");
}

/// One short chaos run (its workers' store calls recorded in `traces` when
/// given), checked: every fault injected, every must-be-zero count zero, all
/// 200 tasks submitted, a clean result.
fn short_run(traces: Option<&std::path::Path>) {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut args = vec![
        "--tasks",
        "200",
        "--workers",
        "3",
        "--concurrency",
        "4",
        "--lease-ms",
        "1500",
        "--submit-secs",
        "30",
        "--fault-every-ms",
        "1500",
        "--restarts",
        "1",
        "--drain-secs",
        "120",
    ];
    let traces = traces.map(|t| t.to_str().expect("a UTF-8 path").to_owned());
    if let Some(traces) = &traces {
        args.extend(["--trace-dir", traces.as_str()]);
    }
    let (output, status) = run_orchestrator(&args);
    assert_clean(&output, status, 5, 200);
}

/// `KEY name calls max limit` and `BUCKET name claims max bound` lines: (name, [numbers]).
fn figures(output: &str, prefix: &str) -> Vec<(String, Vec<i64>)> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().expect("a name").to_owned();
            (name, words.map(|w| w.parse().expect("a number")).collect())
        })
        .collect()
}

#[test]
fn short_chaos_run_with_limits_keeps_every_key_and_bucket_within_its_limit() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 150 tasks over 20 s (7.5 a second) against a bucket of 6 a second,
    // burst 3: the bucket binds. One task in three goes to 6 in-order keys
    // (limit 1), the others to 2 keys of limit 3. Calls of 0.5 to 1.5 s, so
    // a key of limit 3 has enough work in flight to fill its slots; a lease
    // of 3 s covers a call with room for the claim before it.
    let (output, status) = run_orchestrator(&[
        "--limits",
        "--rate-per-sec",
        "6",
        "--burst",
        "3",
        "--in-order-keys",
        "6",
        "--shared-keys",
        "2",
        "--tasks",
        "150",
        "--workers",
        "3",
        "--concurrency",
        "4",
        "--lease-ms",
        "3000",
        "--call-min-ms",
        "500",
        "--call-max-ms",
        "1500",
        "--submit-secs",
        "20",
        "--fault-every-ms",
        "1500",
        "--restarts",
        "1",
        "--drain-secs",
        "120",
    ]);
    // The limits' three must-be-zero counts beside the five of every run.
    assert_clean(&output, status, 8, 150);

    let keys = figures(&output, "KEY ");
    assert_eq!(keys.len(), 8, "every key reported: {keys:?}");
    for (key, n) in &keys {
        let [calls, max, limit] = n[..] else {
            panic!("KEY {key} {n:?}")
        };
        assert!(calls > 0, "{key}: its tasks called the provider");
        assert!(max <= limit, "{key}: {max} calls at once, limit {limit}");
        assert!(max >= 1, "{key}: the sweep saw its calls");
    }
    let in_order: Vec<_> = keys.iter().filter(|(_, n)| n[2] == 1).collect();
    assert_eq!(in_order.len(), 6, "6 keys of limit 1: {keys:?}");
    let buckets = figures(&output, "BUCKET ");
    let [(name, n)] = &buckets[..] else {
        panic!("one bucket: {buckets:?}")
    };
    let [claims, max, bound] = n[..] else {
        panic!("BUCKET {name} {n:?}")
    };
    assert_eq!(bound, 9, "burst 3 + rate 6");
    assert!(claims >= 150, "every task claimed at least once: {claims}");
    assert!(max <= bound, "{name}: {max} claims in one period, bound {bound}");
    // The limits really bound: deliveries were refused for them.
    let throttled: i64 = output
        .lines()
        .find_map(|l| l.strip_prefix("THROTTLED "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a THROTTLED line");
    assert!(throttled > 0, "some deliveries were throttled");
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
