//! One chaos worker process: receives task ids from the run's PostgreSQL
//! queue, runs each delivery through [`Worker::handle`], calls the simulated
//! provider, and acts on the [`Disposition`] like a queue adapter would.
//!
//! It never exits on a database error (connections are killed and the server
//! is restarted under it): it logs, waits a little and carries on. It stops
//! when the orchestrator kills it, or by itself when the orchestrator is gone.
//!
//! ```text
//! chaos-worker --url postgres://… --schema taskfence_chaos_… --worker w1 --lease-ms 2000 --concurrency 4
//! ```
//!
//! With `--trace-dir DIR` it records its store calls there (`chaos::trace`).
//!
//! With `--limits` (the limits mode) a provider call is made only under a
//! lease that covers all of it: its log entry is inserted only if the task's
//! row holds this assignment, running, with `lease_until` past the call's
//! planned end ([`Queue::call_started_fenced`]); otherwise the work function
//! fails retryably without calling. And a lost lease does not abort the call:
//! the provider keeps working on it anyway, so the call runs to its end.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chaos::APP_PREFIX;
use chaos::args::Args;
use chaos::queue::{Message, Queue};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use taskfence::intercept::Intercepted;
use taskfence::runtime::{
    AckReason, Disposition, LeaseHooks, LeaveReason, RetryReason, Worker, WorkerConfig,
};
use taskfence::{Failure, Lease, PgStore, Rejection, Response, TaskId, TaskStore};

/// How the simulated provider behaves.
#[derive(Debug, Clone, Copy)]
struct Provider {
    call_min: Duration,
    call_max: Duration,
    /// Per mille of calls that fail with a retryable error (no answer).
    retryable: u32,
    /// Per mille of calls that fail permanently.
    permanent: u32,
    /// Per mille of calls that produce an answer and then lose it (an
    /// ambiguous failure: the provider did the work, the reply never came).
    lost_reply: u32,
    /// The limits mode: fenced call log, calls never aborted on a lost lease.
    limits: bool,
}

/// Extends the message's visibility with every lease renewal (the SQS pattern).
struct Visibility {
    queue: Queue,
    message: i64,
}

#[async_trait]
impl LeaseHooks for Visibility {
    async fn on_renewed(&self, lease: &Lease) {
        if let Err(e) = self.queue.hide_until(self.message, lease.expires_at()).await {
            eprintln!("extend visibility of message {}: {e}", self.message);
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::from_env();
    let url = args.string("url").expect("--url");
    let schema = args.string("schema").expect("--schema");
    let worker_id = args.string("worker").expect("--worker");
    let lease = Duration::from_millis(args.get("lease-ms", 2000));
    let concurrency: usize = args.get("concurrency", 4);
    let provider = Provider {
        call_min: Duration::from_millis(args.get("call-min-ms", 50)),
        call_max: Duration::from_millis(args.get("call-max-ms", 400)),
        retryable: args.get("retryable-permille", 50),
        permanent: args.get("permanent-permille", 5),
        lost_reply: args.get("lost-reply-permille", 20),
        limits: args.flag("limits"),
    };

    let options: PgConnectOptions = url.parse().expect("a valid PostgreSQL URL");
    let options = options
        .application_name(&format!("{APP_PREFIX}{worker_id}"))
        .disable_statement_logging();
    // test_before_acquire (the default) drops connections killed under us;
    // short timeouts keep a worker from hanging on a server that is restarting.
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(concurrency).unwrap_or(8) * 2 + 2)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options);
    let store = PgStore::builder(pool.clone())
        .schema(&schema)
        .build()
        .expect("a valid schema name");
    let queue = Queue::new(pool, &schema);
    // With --trace-dir, every store call is recorded (and takes the run's turn).
    let store: Arc<dyn TaskStore> = match args.string("trace-dir") {
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            let recorder = chaos::trace::recorder(&dir, &worker_id).expect("the worker's trace file");
            let recorded = Intercepted::new(Arc::new(store), recorder);
            Arc::new(Intercepted::new(
                Arc::new(recorded),
                chaos::trace::Turn::new(&dir),
            ))
        }
        None => Arc::new(store),
    };
    let worker = Worker::new(
        store,
        WorkerConfig::new(worker_id.clone(), lease)
            .stop_grace(Duration::from_millis(500))
            .min_retry_delay(Duration::from_millis(200)),
    )
    .expect("a valid worker config");

    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let parent = std::os::unix::process::parent_id();
    loop {
        // Orphaned (the orchestrator was killed without stopping us): stop too.
        if std::os::unix::process::parent_id() != parent {
            return;
        }
        let free = permits.available_permits();
        if free == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // The message stays hidden a little longer than the first lease;
        // renewals push it further (Visibility).
        let messages = match queue
            .receive(free as i64, lease + Duration::from_millis(500))
            .await
        {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{worker_id}: receive: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        for message in messages {
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let (worker, queue, worker_id) = (worker.clone(), queue.clone(), worker_id.clone());
            tokio::spawn(async move {
                deliver(&worker, &queue, &worker_id, provider, message).await;
                drop(permit);
            });
        }
    }
}

/// One delivery: handle, then act on the disposition.
async fn deliver(worker: &Worker, queue: &Queue, worker_id: &str, provider: Provider, message: Message) {
    let hooks = Visibility {
        queue: queue.clone(),
        message: message.id,
    };
    let task_id = TaskId::from_uuid(message.task_id);
    let result = worker
        .handle(task_id, &hooks, |ctx| {
            let queue = queue.clone();
            let worker_id = worker_id.to_owned();
            async move {
                let (task, version) = (ctx.task().id.as_uuid(), ctx.lease().version());
                if provider.limits {
                    // The provider keeps working on a call whatever happens to
                    // the lease, so the worker waits for its answer too: a
                    // call is never abandoned while it may hold a key's slot.
                    return call_provider(&queue, provider, task, version, &worker_id).await;
                }
                tokio::select! {
                    answer = call_provider(&queue, provider, task, version, &worker_id) => answer,
                    () = ctx.lease_lost() => Err(Failure::retryable("lease lost during the provider call")),
                }
            }
        })
        .await;
    let label = match &result {
        Ok(d) => label(d),
        Err(_) => "error: store unreachable".to_owned(),
    };
    let acted = match result {
        Ok(Disposition::Ack(_)) => queue.ack(message.id).await,
        Ok(Disposition::RetryAfter { delay, .. }) => queue.retry_after(message.id, delay).await,
        // Leave, or a store error: the visibility timeout brings the message back.
        Ok(Disposition::Leave(_)) | Err(_) => Ok(()),
    };
    if let Err(e) = acted {
        eprintln!("{worker_id}: settle message {}: {e}", message.id);
    }
    let _ = queue.delivered(message.task_id, worker_id, &label).await;
}

/// The simulated provider: logs the call, "thinks", then logs its answer
/// *before* returning it, so no answer it produced goes uncounted.
async fn call_provider(
    queue: &Queue,
    p: Provider,
    task: uuid::Uuid,
    version: u64,
    worker: &str,
) -> Result<Response, Failure> {
    let span = p.call_max.saturating_sub(p.call_min).as_millis() as u64;
    let takes = p.call_min + Duration::from_millis(fastrand::u64(0..=span));
    if p.limits {
        let made = queue
            .call_started_fenced(task, version, worker, takes)
            .await
            .map_err(|_| Failure::retryable("provider unreachable"))?;
        if !made {
            return Err(Failure::retryable("the lease does not cover the provider call"));
        }
    } else {
        queue
            .call_started(task, version, worker, takes)
            .await
            .map_err(|_| Failure::retryable("provider unreachable"))?;
    }
    tokio::time::sleep(takes).await;
    let roll = fastrand::u32(0..1000);
    if roll < p.retryable {
        return Err(Failure::retryable("provider returned 503"));
    }
    if roll < p.retryable + p.permanent {
        return Err(Failure::permanent("provider returned 400"));
    }
    let answer = format!("answer:{task}:v{version}:{worker}:{:08x}", fastrand::u32(..));
    // Logged before it is returned: if this write's reply is lost, the answer
    // may exist anyway (ambiguous), which is exactly what the policy is for.
    queue
        .answer_produced(task, version, worker, &answer)
        .await
        .map_err(|_| Failure::ambiguous("provider reply lost"))?;
    if roll < p.retryable + p.permanent + p.lost_reply {
        return Err(Failure::ambiguous("provider reply lost in transit"));
    }
    Ok(Response::from(answer))
}

/// A short, stable label for the report.
fn label(d: &Disposition) -> String {
    match d {
        Disposition::Ack(r) => format!(
            "ack: {}",
            match r {
                AckReason::Completed => "completed",
                AckReason::AlreadyCompleted => "already completed",
                AckReason::CompletedElsewhere => "completed elsewhere",
                AckReason::Failed => "failed",
                AckReason::Cancelled => "cancelled",
                AckReason::NotFound => "not found",
                _ => "other",
            }
        ),
        Disposition::RetryAfter { reason, .. } => format!(
            "retry after: {}",
            match reason {
                RetryReason::Busy => "busy",
                RetryReason::Backoff => "backoff",
                RetryReason::Scheduled { .. } => "retry scheduled",
                RetryReason::Throttled => "throttled",
                _ => "other",
            }
        ),
        Disposition::Leave(LeaveReason::LeaseLost(r)) => {
            format!(
                "leave: lease lost ({})",
                r.as_ref().map_or("store unreachable", kind)
            )
        }
        Disposition::Leave(LeaveReason::Rejected(r)) => format!("leave: write rejected ({})", kind(r)),
        Disposition::Leave(_) => "leave: other".to_owned(),
    }
}

fn kind(r: &Rejection) -> &'static str {
    match r {
        Rejection::AlreadyCompleted(_) => "already completed",
        Rejection::Superseded { .. } => "superseded",
        Rejection::LeaseExpired => "lease expired",
        Rejection::NotRunning(_) => "not running",
        _ => "other",
    }
}
