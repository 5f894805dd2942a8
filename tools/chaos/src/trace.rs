//! The chaos run's history, recorded and merged into one sequence for the
//! protocol's trace replay (`model_check::replay`).
//!
//! With `--trace-dir DIR`, every worker process wraps its store in a
//! [`taskfence::testing::trace::Recorder`] whose steps are appended, as
//! JSON lines, to `DIR/<worker>.jsonl` while they happen ([`recorder`]),
//! and in a [`Turn`]: a file lock (`DIR/turn`) held around every store
//! operation of every process, so a step's "before" read, its operation and
//! its "after" read happen with no other process's step in between. Each
//! line carries a number drawn from `DIR/seq` under the lock, so the
//! processes' files merge into the one order the store saw ([`merge`]).
//!
//! A step is written when it starts (the outcome `unknown`, the tasks read
//! before it) and again when it ends: a process killed mid-call leaves the
//! first line only, a step whose write may or may not have happened, which
//! the replay settles with the next read of the task.
//!
//! The lock changes the run: the workers' store calls take turns, and a
//! process stopped (`SIGSTOP`) while it holds the lock stalls every other
//! one until it resumes (their leases may expire meanwhile: harsher, not
//! milder, than the run without the trace).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use taskfence::intercept::{Call, Intercept, Outcome, Pending};
use taskfence::testing::trace::{Recorder, Step};

/// How long a step's reads are retried while the server restarts or a
/// connection was killed ([`Recorder::with_read_patience`]).
pub const READ_PATIENCE: Duration = Duration::from_secs(30);

/// Holds `DIR/turn` locked (an exclusive `flock`, shared by every process of
/// the run) around each store operation.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("chaos-turn-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let turn = chaos::trace::Turn::new(&dir);
/// # let _ = turn;
/// ```
#[derive(Debug, Clone)]
pub struct Turn {
    path: PathBuf,
}

impl Turn {
    /// The turn of the run whose traces go to `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("turn"),
        }
    }

    async fn take(&self) -> std::io::Result<File> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)?;
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

#[async_trait]
impl Intercept for Turn {
    async fn around<'a, T: Outcome + Send + 'a>(
        &'a self,
        _call: Call,
        run: Pending<'a, T>,
    ) -> taskfence::Result<T> {
        // Released when the file is closed, also when the process is killed.
        let held = self.take().await;
        if let Err(e) = &held {
            eprintln!("trace turn {}: {e}", self.path.display());
        }
        let answer = run.await;
        drop(held);
        answer
    }
}

/// The next number of `DIR/seq` (0, 1, 2…), under its own lock.
fn next_seq(path: &Path) -> std::io::Result<u64> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    file.lock()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let n: u64 = text.trim().parse().unwrap_or(0);
    file.seek(SeekFrom::Start(0))?;
    file.set_len(0)?;
    write!(file, "{}", n + 1)?;
    Ok(n)
}

/// A recorder whose steps are appended to `dir/<worker>.jsonl` as they
/// happen, each with its number from `dir/seq`; reads are retried for
/// [`READ_PATIENCE`].
///
/// ```
/// let dir = std::env::temp_dir().join(format!("chaos-trace-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let recorder = chaos::trace::recorder(&dir, "w1").unwrap();
/// assert!(recorder.steps().is_empty());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
///
/// # Errors
///
/// When the worker's file cannot be created.
pub fn recorder(dir: &Path, worker: &str) -> std::io::Result<Recorder> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{worker}.jsonl")))?;
    let file = Mutex::new(file);
    let seq = dir.join("seq");
    let passes = AtomicU64::new(0);
    let worker = worker.to_owned();
    Ok(Recorder::default()
        .with_read_patience(READ_PATIENCE)
        .with_sink(move |step: &Step| {
            // The recorder passes each operation's step twice, start then end.
            let phase = if passes.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                "start"
            } else {
                "end"
            };
            let n = match next_seq(&seq) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("trace seq: {e}");
                    return;
                }
            };
            let line = serde_json::json!({ "seq": n, "worker": worker, "phase": phase, "step": step });
            let mut out = line.to_string();
            out.push('\n');
            if let Err(e) = file.lock().expect("trace file").write_all(out.as_bytes()) {
                eprintln!("trace write: {e}");
            }
        }))
}

/// The processes' histories merged into one.
#[derive(Debug, Default)]
pub struct Merged {
    /// The steps, in the order the store saw them.
    pub steps: Vec<Step>,
    /// The worker files read.
    pub files: usize,
    /// Steps whose process was killed before they ended (kept, as `unknown`).
    pub cut_short: usize,
}

/// Reads every `*.jsonl` in `dir` and merges the steps by their numbers:
/// each operation is placed where it started (no other step ran while it
/// held the turn), as it ended, or as it started when its process died
/// first. A last line cut in half by a kill is skipped.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("chaos-merge-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let merged = chaos::trace::merge(&dir).unwrap();
/// assert!(merged.steps.is_empty());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
///
/// # Errors
///
/// A file that cannot be read, a line that does not parse (other than a
/// file's last), or an end with no start before it.
pub fn merge(dir: &Path) -> Result<Merged, String> {
    let mut merged = Merged::default();
    let mut placed: Vec<(u64, Step)> = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    entries.sort();
    for path in entries {
        merged.files += 1;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut open: Option<(u64, Step)> = None;
        for (i, line) in lines.iter().enumerate() {
            let value: serde_json::Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(_) if i + 1 == lines.len() => break,
                Err(e) => return Err(format!("{} line {}: {e}", path.display(), i + 1)),
            };
            let seq = value["seq"].as_u64().ok_or("a line without its number")?;
            let step: Step = serde_json::from_value(value["step"].clone())
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
            match value["phase"].as_str() {
                Some("start") => {
                    if let Some(cut) = open.replace((seq, step)) {
                        return Err(format!(
                            "{}: step {} started and never ended, yet its process went on",
                            path.display(),
                            cut.0
                        ));
                    }
                }
                Some("end") => {
                    let (start, _) = open
                        .take()
                        .ok_or_else(|| format!("{} line {}: an end with no start", path.display(), i + 1))?;
                    placed.push((start, step));
                }
                other => return Err(format!("{} line {}: phase {other:?}", path.display(), i + 1)),
            }
        }
        if let Some(cut) = open {
            merged.cut_short += 1;
            placed.push(cut);
        }
    }
    placed.sort_by_key(|(seq, _)| *seq);
    merged.steps = placed.into_iter().map(|(_, step)| step).collect();
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, worker: &str, phase: &str, op: &str, outcome: &str) -> String {
        let mut step = Step::new(op);
        step.outcome = outcome.to_owned();
        let line = serde_json::json!({ "seq": seq, "worker": worker, "phase": phase, "step": step });
        format!("{line}\n")
    }

    #[test]
    fn merge_orders_steps_by_their_start_and_keeps_a_killed_one_as_unknown() {
        let dir = std::env::temp_dir().join(format!("chaos-merge-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // w1 claims (0–2), then is killed during a renewal (5), mid-line.
        let w1 = line(0, "w1", "start", "claim", "unknown")
            + &line(2, "w1", "end", "claim", "acquired")
            + &line(5, "w1", "start", "renew", "unknown")
            + "{\"seq\": 6, \"work";
        // w2's completion ran between them (3–4); its end drew 4.
        let w2 =
            line(3, "w2", "start", "complete", "unknown") + &line(4, "w2", "end", "complete", "accepted");
        std::fs::write(dir.join("w1.jsonl"), w1).unwrap();
        std::fs::write(dir.join("w2.jsonl"), w2).unwrap();
        std::fs::write(dir.join("seq"), "7").unwrap();
        let merged = merge(&dir).unwrap();
        let got: Vec<(&str, &str)> = merged
            .steps
            .iter()
            .map(|s| (s.op.as_str(), s.outcome.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("claim", "acquired"),
                ("complete", "accepted"),
                ("renew", "unknown")
            ]
        );
        assert_eq!((merged.files, merged.cut_short), (2, 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn merge_refuses_an_end_with_no_start() {
        let dir = std::env::temp_dir().join(format!("chaos-merge-end-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let w1 = line(0, "w1", "end", "claim", "acquired") + &line(1, "w1", "start", "renew", "unknown");
        std::fs::write(dir.join("w1.jsonl"), w1).unwrap();
        let why = merge(&dir).unwrap_err();
        assert!(why.contains("an end with no start"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
