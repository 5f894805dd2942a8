//! The example as a service: its binary on a database of its own (or on a
//! SQLite file, `--sqlite PATH`), driven over HTTP, stopped by signals,
//! killed and paused mid-work.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use taskfence::store::AttemptOutcome;
use taskfence::{InputHash, NewTask, PgStore, RequestKey, SqliteStore, Status, TaskStore};
use taskfence_test_support::{ChildProcess, TempDatabase, eventually_every, free_port};

/// One `pg-worker` process on `db`, listening on a port of its own.
struct Service {
    process: ChildProcess,
    base: String,
}

impl Service {
    fn start(db: &TempDatabase, name: &str, work_ms: u64, lease_secs: u64) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pg-worker"));
        command.env_clear().env("DATABASE_URL", db.url());
        Self::spawn(command, name, work_ms, lease_secs)
    }

    /// The service on the SQLite file at `path` (`--sqlite PATH`), no server.
    fn start_sqlite(path: &Path, name: &str, work_ms: u64) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pg-worker"));
        command.env_clear().arg("--sqlite").arg(path);
        Self::spawn(command, name, work_ms, 30)
    }

    fn spawn(mut command: Command, name: &str, work_ms: u64, lease_secs: u64) -> Self {
        let port = free_port();
        command
            .env("LISTEN", format!("127.0.0.1:{port}"))
            .env("WORK_MS", work_ms.to_string())
            .env("LEASE_SECS", lease_secs.to_string())
            .stdout(Stdio::null());
        let mut process = ChildProcess::spawn(name, &mut command);
        process
            .wait_listening(port, Duration::from_secs(60))
            .unwrap_or_else(|status| panic!("{name} exited at start: {status}"));
        Self {
            process,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// SIGTERM, and the exit within `within`.
    async fn stop(mut self, within: Duration) -> std::process::ExitStatus {
        self.process.signal("TERM");
        self.process
            .wait_exit(within)
            .await
            .expect("the service stops within the grace after SIGTERM")
    }
}

/// The worker id a service process claims under.
fn worker_of(service: &Service) -> String {
    format!("pg-worker-{}", service.process.pid())
}

/// The workers holding a running task among `ids` now.
async fn holders(store: &PgStore, ids: &[taskfence::TaskId]) -> std::collections::HashSet<String> {
    let mut workers = std::collections::HashSet::new();
    for &id in ids {
        let task = store.get(id).await.unwrap().expect("submitted");
        if task.status == Status::Running {
            let attempts = store.attempts(id).await.unwrap();
            workers.extend(attempts.last().map(|a| a.worker.clone()));
        }
    }
    workers
}

async fn post(http: &reqwest::Client, base: &str, key: &str, name: &str) -> (u16, serde_json::Value) {
    let reply = http
        .post(format!("{base}/greetings"))
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "name": name }))
        .send()
        .await
        .expect("the service answers");
    (reply.status().as_u16(), reply.json().await.expect("a JSON body"))
}

/// Polls `GET /greetings/{id}` until the task is completed; its body.
async fn completed(http: &reqwest::Client, base: &str, id: &str) -> serde_json::Value {
    eventually_every(Duration::from_secs(10), Duration::from_millis(20), || async {
        let body: serde_json::Value = http
            .get(format!("{base}/greetings/{id}"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (body["status"] == "completed").then_some(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_greeting_is_answered_once_and_sigterm_stops_the_service() {
    let db = TempDatabase::create().await;
    let service = Service::start(&db, "pg-worker", 50, 30);
    let http = reqwest::Client::new();

    let (code, created) = post(&http, &service.base, "k-1", "Ada").await;
    assert_eq!(code, 202, "{created}");
    let id = created["id"].as_str().expect("a task id").to_owned();
    let done = completed(&http, &service.base, &id).await;
    assert_eq!(done["response"], "Hello, Ada!");
    assert_eq!(done["attempts"], 1);

    // The same request again is the same task; the same key for another
    // name is refused and writes nothing.
    assert_eq!(post(&http, &service.base, "k-1", "Ada").await, (202, created));
    let (code, refused) = post(&http, &service.base, "k-1", "Grace").await;
    assert_eq!(code, 422, "{refused}");
    let store = PgStore::new(db.pool(2).await);
    let refused_key = RequestKey::new("demo", "greet", "k-1");
    let kept = store.find(&refused_key).await.unwrap().expect("the first task");
    assert_eq!(kept.payload, b"Ada", "the refused request changed nothing");

    let status = service.stop(Duration::from_secs(10)).await;
    assert!(status.success(), "a clean exit on SIGTERM: {status}");
}

/// Three processes work one queue; one is killed (SIGKILL) and one paused
/// (SIGSTOP) past its lease while they hold tasks mid-work, a fresh one
/// replaces the dead one and the paused one resumes. Nothing is lost,
/// every task has exactly one saved response, the takeovers show in the
/// attempts, and no task went over its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_processes_lose_nothing_and_save_once() {
    const TASKS: usize = 240;
    let db = TempDatabase::create().await;
    let store = PgStore::new(db.pool(4).await);
    store.migrate().await.unwrap();
    let (work_ms, lease_secs) = (400, 2);
    let mut doomed = Service::start(&db, "pg-worker-killed", work_ms, lease_secs);
    let paused = Service::start(&db, "pg-worker-paused", work_ms, lease_secs);
    let steady = Service::start(&db, "pg-worker-steady", work_ms, lease_secs);

    let mut ids = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let name = format!("n-{i}");
        let task = NewTask::new(
            RequestKey::new("demo", "greet", format!("bulk-{i}")),
            InputHash::of([name.as_bytes()]),
        )
        .payload(name)
        .without_handoff();
        ids.push(store.submit(task).await.unwrap().into_task().id);
    }
    // Strike while both doomed processes hold tasks mid-work.
    let (doomed_id, paused_id) = (worker_of(&doomed), worker_of(&paused));
    eventually_every(Duration::from_secs(20), Duration::from_millis(50), || async {
        let holders = holders(&store, &ids).await;
        (holders.contains(&doomed_id) && holders.contains(&paused_id)).then_some(())
    })
    .await;

    doomed.process.kill_hard().await;
    paused.process.signal("STOP");
    tokio::time::sleep(Duration::from_secs(lease_secs * 2)).await;
    let replacement = Service::start(&db, "pg-worker-replacement", work_ms, lease_secs);
    paused.process.signal("CONT");

    let all_done = eventually_every(Duration::from_secs(120), Duration::from_millis(200), || async {
        let mut done = Vec::with_capacity(TASKS);
        for &id in &ids {
            let task = store.get(id).await.unwrap().expect("nothing lost");
            if task.status != Status::Completed {
                return None;
            }
            done.push(task);
        }
        Some(done)
    })
    .await;

    let mut taken_over = 0;
    for task in &all_done {
        let attempts = store.attempts(task.id).await.unwrap();
        let saved = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .count();
        assert_eq!(saved, 1, "one saved response for {}: {attempts:?}", task.id);
        let name = std::str::from_utf8(&task.payload).unwrap();
        assert_eq!(
            task.response.as_ref().and_then(|r| r.as_str()),
            Some(format!("Hello, {name}!").as_str())
        );
        assert!(
            task.attempts() <= task.policy.max_attempts,
            "within budget: {attempts:?}"
        );
        if attempts.len() > 1 {
            taken_over += 1;
            assert!(
                attempts[..attempts.len() - 1]
                    .iter()
                    .all(|a| a.worker == doomed_id || a.worker == paused_id),
                "only the killed and the paused process lost tasks: {attempts:?}"
            );
        }
    }
    eprintln!("{taken_over} of {TASKS} tasks were taken over from the killed or the paused process");
    assert!(taken_over > 0, "the faults hit tasks mid-work");

    for service in [paused, steady, replacement] {
        let status = service.stop(Duration::from_secs(40)).await;
        assert!(status.success(), "a clean exit on SIGTERM: {status}");
    }
}

/// `--sqlite PATH`: two processes on one file, no server. Greetings
/// submitted to either are answered once (each key one task, whichever
/// process took it), a conflicting request is refused and writes nothing,
/// and both stop cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_sqlite_file_two_processes_answer_each_greeting_once() {
    let dir = std::env::temp_dir().join(format!("pg-worker-sqlite-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tasks.db");
    let services = [
        Service::start_sqlite(&path, "pg-worker-sqlite-a", 20),
        Service::start_sqlite(&path, "pg-worker-sqlite-b", 20),
    ];
    let http = reqwest::Client::new();

    let mut ids = Vec::new();
    for i in 0..20 {
        let base = &services[i % 2].base;
        let (code, created) = post(&http, base, &format!("k-{i}"), &format!("n-{i}")).await;
        assert_eq!(code, 202, "{created}");
        // The same request through the other process is the same task.
        let other = &services[(i + 1) % 2].base;
        assert_eq!(
            post(&http, other, &format!("k-{i}"), &format!("n-{i}")).await,
            (202, created.clone())
        );
        ids.push(created["id"].as_str().expect("a task id").to_owned());
    }
    for (i, id) in ids.iter().enumerate() {
        let done = completed(&http, &services[(i + 1) % 2].base, id).await;
        assert_eq!(done["response"], format!("Hello, n-{i}!"));
        assert_eq!(done["attempts"], 1, "answered once: {done}");
    }
    let (code, refused) = post(&http, &services[1].base, "k-0", "Grace").await;
    assert_eq!(code, 422, "{refused}");

    for service in services {
        let status = service.stop(Duration::from_secs(10)).await;
        assert!(status.success(), "a clean exit on SIGTERM: {status}");
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let kept = store
        .find(&RequestKey::new("demo", "greet", "k-0"))
        .await
        .unwrap()
        .expect("the first task");
    assert_eq!(kept.payload, b"n-0", "the refused request changed nothing");
    for (i, id) in ids.iter().enumerate() {
        let attempts = store.attempts(id.parse().unwrap()).await.unwrap();
        let saved = attempts
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Completed)
            .count();
        assert_eq!(saved, 1, "one saved response for k-{i}: {attempts:?}");
    }
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
