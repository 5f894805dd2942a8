//! `taskfence::metrics::Observed`: the counters, histogram, spans and
//! warnings it records for each outcome, and (through the conformance and
//! inspection suites) that it forwards every call faithfully.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use taskfence::clock::ManualClock;
use taskfence::inspect::{Inspect, TaskQuery};
use taskfence::intercept::Intercepted;
use taskfence::metrics::{self, Observed, Recorder};
use taskfence::store::ReopenRequest;
use taskfence::testing::{Fixture, InspectFixture, MemoryFixture};
use taskfence::testing::{acquire, task_in};
use taskfence::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

// ---------------------------------------------------------------------------
// The wrapper through the whole conformance and inspection suites.

struct ObservedFixture(MemoryFixture);

#[async_trait::async_trait]
impl Fixture for ObservedFixture {
    fn store(&self) -> Arc<dyn TaskStore> {
        Arc::new(Intercepted::new(self.0.store(), Recorder))
    }
    async fn advance(&self, by: Duration) {
        self.0.advance(by).await;
    }
    async fn record_count(&self) -> u64 {
        self.0.record_count().await
    }
}

impl InspectFixture for ObservedFixture {
    fn inspector(&self) -> Arc<dyn Inspect> {
        Arc::new(Intercepted::new(self.0.inspector(), Recorder))
    }
}

mod conformance {
    use super::*;
    taskfence::testing::conformance_suite!(async { ObservedFixture(MemoryFixture::new()) });
}

mod inspection {
    use super::*;
    taskfence::testing::inspection_suite!(async { ObservedFixture(MemoryFixture::new()) });
}

mod limits {
    use super::*;
    taskfence::testing::limits_suite!(async { ObservedFixture(MemoryFixture::new()) });
}

// ---------------------------------------------------------------------------
// What was recorded.

/// Metrics keyed by name and sorted `label=value` pairs.
struct Recorded {
    counters: HashMap<(String, Vec<(String, String)>), u64>,
    histograms: HashMap<(String, Vec<(String, String)>), usize>,
}

impl Recorded {
    fn key(name: &str, labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
        let mut labels: Vec<_> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        (name.to_owned(), labels)
    }

    /// The counter's value; 0 when it was never incremented.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&Self::key(name, labels)).copied().unwrap_or(0)
    }

    /// `taskfence_operations_total` for `operation`, `outcome` and `reason`.
    fn ops(&self, operation: &str, outcome: &str, reason: Option<&str>) -> u64 {
        let mut labels = vec![("operation", operation), ("outcome", outcome)];
        labels.extend(reason.map(|r| ("reason", r)));
        self.counter("taskfence_operations_total", &labels)
    }

    /// Every `taskfence_operations_total` series, summed.
    fn ops_total(&self) -> u64 {
        self.counters
            .iter()
            .filter(|((name, _), _)| name == "taskfence_operations_total")
            .map(|(_, v)| v)
            .sum()
    }

    /// How many latency samples `operation` got.
    fn samples(&self, operation: &str) -> usize {
        self.histograms
            .get(&Self::key(
                "taskfence_operation_duration_seconds",
                &[("operation", operation)],
            ))
            .copied()
            .unwrap_or(0)
    }
}

/// A span or event as the collecting layer saw it.
#[derive(Debug, Clone, Default)]
struct Captured {
    name: String,
    level: Option<Level>,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

/// Keeps every closed span and every event.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Captured>>>,
    events: Arc<Mutex<Vec<Captured>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collector {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("the span being created");
        let mut captured = Captured {
            name: attrs.metadata().name().to_owned(),
            level: Some(*attrs.metadata().level()),
            parent: span.parent().map(|p| p.name().to_owned()),
            fields: HashMap::new(),
        };
        attrs.record(&mut Fields(&mut captured.fields));
        span.extensions_mut().insert(captured);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a live span");
        if let Some(captured) = span.extensions_mut().get_mut::<Captured>() {
            values.record(&mut Fields(&mut captured.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut captured = Captured {
            name: event.metadata().name().to_owned(),
            level: Some(*event.metadata().level()),
            parent: ctx.event_span(event).map(|s| s.name().to_owned()),
            fields: HashMap::new(),
        };
        event.record(&mut Fields(&mut captured.fields));
        self.events.lock().unwrap().push(captured);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("the span being closed");
        if let Some(captured) = span.extensions_mut().remove::<Captured>() {
            self.spans.lock().unwrap().push(captured);
        }
    }
}

struct Observation {
    metrics: Recorded,
    spans: Vec<Captured>,
    events: Vec<Captured>,
}

impl Observation {
    /// The wrapper's spans (`taskfence.<operation>`) in the order they closed.
    fn spans(&self, name: &str) -> Vec<&Captured> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }
    /// Warnings about terminal failures.
    fn terminal_warnings(&self) -> Vec<&Captured> {
        self.events
            .iter()
            .filter(|e| e.level == Some(Level::WARN) && e.field("message") == Some("task failed terminally"))
            .collect()
    }
}

/// Runs `scenario` on this thread with a local metrics recorder and a
/// collecting subscriber, on an `Observed` MemoryStore with a manual clock.
fn observe<F, Fut>(scenario: F) -> Observation
where
    F: FnOnce(Observed<MemoryStore>, ManualClock) -> Fut,
    Fut: Future<Output = taskfence::Result<()>>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let collector = Collector::default();
    let subscriber = tracing_subscriber::registry().with(collector.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = ManualClock::default();
    let store = metrics::observe(MemoryStore::with_clock(clock.clone()));
    ::metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(subscriber, || runtime.block_on(scenario(store, clock)))
    })
    .expect("the scenario's store calls");

    let mut metrics = Recorded {
        counters: HashMap::new(),
        histograms: HashMap::new(),
    };
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let k = Recorded::key(key.name(), &labels);
        match value {
            DebugValue::Counter(n) => {
                metrics.counters.insert(k, n);
            }
            DebugValue::Histogram(samples) => {
                assert!(
                    samples.iter().all(|s| s.0 >= 0.0 && s.0.is_finite()),
                    "latencies are finite seconds"
                );
                metrics.histograms.insert(k, samples.len());
            }
            DebugValue::Gauge(_) => panic!("no gauges are recorded"),
        }
    }
    let spans = collector.spans.lock().unwrap().clone();
    let events = collector.events.lock().unwrap().clone();
    Observation {
        metrics,
        spans,
        events,
    }
}

const LEASE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Metrics.

#[test]
fn fenced_writes_count_accepted_and_rejected_by_reason() {
    let seen = observe(|store, clock| async move {
        let task = store.submit(task_in("tenant-1", "a")).await?.into_task();
        assert!(!store.submit(task_in("tenant-1", "a")).await?.is_created());

        let first = acquire(&store, task.id, "w1").await;
        clock.advance(LEASE * 2);
        // The same assignment, its lease expired.
        let stale = first.clone();
        assert_eq!(
            store.complete(first, Response::from("late")).await?.rejection(),
            Some(&Rejection::LeaseExpired)
        );
        // Taken over: the first lease is now superseded everywhere.
        let mut second = acquire(&store, task.id, "w2").await;
        assert!(matches!(
            store.complete(stale, Response::from("late")).await?.rejection(),
            Some(Rejection::Superseded { .. })
        ));
        assert!(store.renew(&mut second, LEASE).await?.is_accepted());
        assert!(store.record_operation(&second, "op-1").await?.is_accepted());
        assert!(store.complete(second, Response::from("ok")).await?.is_accepted());
        // A duplicate delivery answers the saved response.
        assert!(matches!(
            store.claim(task.id, ClaimRequest::new("w3", LEASE)).await?,
            Claim::Completed(_)
        ));
        assert!(matches!(
            store.cancel(task.id, "too late").await?.rejection(),
            Some(Rejection::AlreadyCompleted(_))
        ));
        assert!(matches!(
            store
                .reopen(task.id, ReopenRequest::new("op", "why"))
                .await?
                .rejection(),
            Some(Rejection::AlreadyCompleted(_))
        ));
        assert!(store.get(task.id).await?.is_some());
        assert!(store.get(TaskId::new()).await?.is_none());
        assert_eq!(store.attempts(task.id).await?.len(), 2);
        Ok(())
    });
    let m = &seen.metrics;
    assert_eq!(m.ops("submit", "created", None), 1);
    assert_eq!(m.ops("submit", "existing", None), 1);
    assert_eq!(m.ops("claim", "acquired", None), 2);
    assert_eq!(m.ops("claim", "completed", None), 1);
    assert_eq!(m.ops("complete", "rejected", Some("lease_expired")), 1);
    assert_eq!(m.ops("complete", "rejected", Some("superseded")), 1);
    assert_eq!(m.ops("complete", "accepted", None), 1);
    assert_eq!(m.ops("renew", "accepted", None), 1);
    assert_eq!(m.ops("record_operation", "accepted", None), 1);
    assert_eq!(m.ops("cancel", "rejected", Some("already_completed")), 1);
    assert_eq!(m.ops("reopen", "rejected", Some("already_completed")), 1);
    assert_eq!(m.ops("get", "found", None), 1);
    assert_eq!(m.ops("get", "absent", None), 1);
    assert_eq!(m.ops("attempts", "ok", None), 1);
    // Nothing else was counted: 15 calls, 15 increments.
    assert_eq!(m.ops_total(), 15);
    assert_eq!(m.counter("taskfence_tasks_reopened_total", &[]), 0);
    assert_eq!(m.samples("complete"), 3);
    assert_eq!(m.samples("claim"), 3);
    assert_eq!(m.samples("submit"), 2);
    assert!(seen.terminal_warnings().is_empty());
}

#[test]
fn errors_count_by_kind() {
    let seen = observe(|store, _clock| async move {
        let task = store.submit(task_in("tenant-1", "a")).await?.into_task();
        let conflict = NewTask::new(task.key.clone(), InputHash::of(["other input"]));
        assert!(matches!(
            store.submit(conflict).await,
            Err(Error::KeyConflict { .. })
        ));
        assert!(matches!(
            store.cancel(TaskId::new(), "gone").await,
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            store.reopen(TaskId::new(), ReopenRequest::new("op", "why")).await,
            Err(Error::NotFound(_))
        ));
        // A blank worker: invalid input, nothing claimed.
        assert!(matches!(
            store.claim(task.id, ClaimRequest::new(" ", LEASE)).await,
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(store.due(0).await, Err(Error::InvalidInput(_))));
        // A batch refused whole counts one error.
        assert!(matches!(
            store
                .claim_many(&[task.id, task.id], ClaimRequest::new("w", LEASE))
                .await,
            Err(Error::InvalidInput(_))
        ));
        assert_eq!(
            store.get(task.id).await?.unwrap().version,
            0,
            "nothing was claimed"
        );
        Ok(())
    });
    let m = &seen.metrics;
    assert_eq!(m.ops("submit", "error", Some("key_conflict")), 1);
    assert_eq!(m.ops("cancel", "error", Some("not_found")), 1);
    assert_eq!(m.ops("reopen", "error", Some("not_found")), 1);
    assert_eq!(m.ops("claim", "error", Some("invalid_input")), 1);
    assert_eq!(m.ops("due", "error", Some("invalid_input")), 1);
    assert_eq!(m.ops("claim_many", "error", Some("invalid_input")), 1);
    assert_eq!(m.ops_total(), 8);
    assert_eq!(m.samples("claim"), 1, "errors are timed too");
    assert_eq!(
        m.counter("taskfence_tasks_redispatched_total", &[("source", "due")]),
        0
    );
}

#[test]
fn terminal_failures_reopenings_and_warnings() {
    let mut ids = Vec::new();
    let seen = observe(|store, clock| {
        let ids = &mut ids;
        async move {
            let once = RetryPolicy::default().max_attempts(1);
            // Exhausted by a failure report.
            let a = store
                .submit(task_in("tenant-1", "a").policy(once))
                .await?
                .into_task();
            let lease = acquire(&store, a.id, "w").await;
            let retry = store.fail(lease, Failure::retryable("provider down")).await?;
            assert!(matches!(retry, Fenced::Accepted(Retry::Exhausted(_))));
            // A permanent failure.
            let b = store.submit(task_in("tenant-1", "b")).await?.into_task();
            let lease = acquire(&store, b.id, "w").await;
            let retry = store.fail(lease, Failure::permanent("400 bad prompt")).await?;
            assert!(matches!(retry, Fenced::Accepted(Retry::Exhausted(_))));
            // A claim of a task failed by a report is not another terminal failure.
            assert!(matches!(
                store.claim(a.id, ClaimRequest::new("w", LEASE)).await?,
                Claim::Failed(_)
            ));

            // Reopened by an operator, then its worker's lease expires with
            // the budget spent: the next claim makes it terminal.
            let reopened = store
                .reopen(a.id, ReopenRequest::new("alice", "provider fixed"))
                .await?;
            assert!(reopened.is_accepted());
            let _crashed = acquire(&store, a.id, "w").await;
            clock.advance(LEASE * 2);
            assert!(matches!(
                store.claim(a.id, ClaimRequest::new("w", LEASE)).await?,
                Claim::Failed(_)
            ));
            // A redelivery's claim answers the same: it counts again (documented upper bound).
            let claims = store.claim_many(&[a.id], ClaimRequest::new("w", LEASE)).await?;
            assert!(matches!(claims[..], [Claim::Failed(_)]));
            // Reopening a live task is refused.
            let c = store.submit(task_in("tenant-1", "c")).await?.into_task();
            assert!(matches!(
                store
                    .reopen(c.id, ReopenRequest::new("alice", "why"))
                    .await?
                    .rejection(),
                Some(Rejection::NotTerminal(_))
            ));
            ids.extend([a.id, b.id]);
            Ok(())
        }
    });
    let m = &seen.metrics;
    let failed = |via, reason| {
        m.counter(
            "taskfence_tasks_failed_total",
            &[("via", via), ("reason", reason)],
        )
    };
    assert_eq!(failed("fail", "attempts_exhausted"), 1);
    assert_eq!(failed("fail", "permanent"), 1);
    assert_eq!(failed("claim", "attempts_exhausted"), 2);
    assert_eq!(m.ops("fail", "accepted", Some("exhausted")), 2);
    assert_eq!(m.ops("claim", "failed", None), 2);
    assert_eq!(m.ops("claim_many", "failed", None), 1);
    assert_eq!(m.ops("reopen", "accepted", None), 1);
    assert_eq!(m.ops("reopen", "rejected", Some("not_terminal")), 1);
    assert_eq!(m.counter("taskfence_tasks_reopened_total", &[]), 1);

    let warnings = seen.terminal_warnings();
    assert_eq!(warnings.len(), 4, "{warnings:#?}");
    let (a, b) = (ids[0].to_string(), ids[1].to_string());
    let fields = |w: &Captured| {
        (
            w.field("task_id").unwrap().to_owned(),
            w.field("key").unwrap().to_owned(),
            w.field("via").unwrap().to_owned(),
            w.field("reason").unwrap().to_owned(),
        )
    };
    assert_eq!(
        fields(warnings[0]),
        (a.clone(), "a".into(), "fail".into(), "attempts_exhausted".into())
    );
    assert_eq!(
        fields(warnings[1]),
        (b, "b".into(), "fail".into(), "permanent".into())
    );
    assert_eq!(
        fields(warnings[2]),
        (a, "a".into(), "claim".into(), "attempts_exhausted".into())
    );
    assert_eq!(warnings[0].field("scope"), Some("tenant-1"));
    assert_eq!(warnings[0].field("operation"), Some("chat.reply"));
    assert_eq!(warnings[0].parent.as_deref(), Some("taskfence.fail"));
    assert_eq!(warnings[2].parent.as_deref(), Some("taskfence.claim"));
    assert_eq!(warnings[3].parent.as_deref(), Some("taskfence.claim_many"));
}

#[test]
fn redispatch_and_purge_counts() {
    let seen = observe(|store, clock| async move {
        let short = Duration::from_secs(60);
        // Two completed tasks past their retention, one still within it.
        for key in ["p1", "p2"] {
            let task = store
                .submit(task_in("tenant-1", key).retention(short))
                .await?
                .into_task();
            let lease = acquire(&store, task.id, "w").await;
            assert!(store.complete(lease, Response::from("ok")).await?.is_accepted());
        }
        let kept = store.submit(task_in("tenant-1", "kept")).await?.into_task();
        let lease = acquire(&store, kept.id, "w").await;
        assert!(store.complete(lease, Response::from("ok")).await?.is_accepted());
        // One backing off, one stranded (never claimed).
        let retried = store.submit(task_in("tenant-1", "r")).await?.into_task();
        let lease = acquire(&store, retried.id, "w").await;
        let answer = store.fail(lease, Failure::retryable("429")).await?;
        assert!(matches!(answer, Fenced::Accepted(Retry::Scheduled { .. })));
        let stranded = store.submit(task_in("tenant-1", "s")).await?.into_task();

        clock.advance(Duration::from_secs(3600));
        assert_eq!(store.due(10).await?, vec![retried.id]);
        let lost = store.stranded(Duration::from_secs(600), 10).await?;
        assert_eq!(lost.iter().map(|t| t.id).collect::<Vec<_>>(), vec![stranded.id]);
        assert_eq!(store.purge_expired(1).await?, 1);
        assert_eq!(store.purge_expired(10).await?, 1);
        assert_eq!(store.purge_expired(10).await?, 0);
        assert!(store.get(kept.id).await?.is_some());
        assert_eq!(store.counts(None).await?.total(), 3);
        assert_eq!(store.list(&TaskQuery::new()).await?.tasks.len(), 3);
        assert!(store.story(kept.id).await?.is_some());
        Ok(())
    });
    let m = &seen.metrics;
    assert_eq!(
        m.counter("taskfence_tasks_redispatched_total", &[("source", "due")]),
        1
    );
    assert_eq!(
        m.counter("taskfence_tasks_redispatched_total", &[("source", "stranded")]),
        1
    );
    assert_eq!(m.counter("taskfence_tasks_purged_total", &[]), 2);
    assert_eq!(m.ops("purge_expired", "ok", None), 3);
    assert_eq!(m.ops("fail", "accepted", Some("scheduled")), 1);
    assert_eq!(m.ops("counts", "ok", None), 1);
    assert_eq!(m.ops("list", "ok", None), 1);
    assert_eq!(m.ops("story", "found", None), 1);
    assert_eq!(m.samples("purge_expired"), 3);
    assert_eq!(m.samples("stranded"), 1);
    assert_eq!(
        m.counter(
            "taskfence_tasks_failed_total",
            &[("via", "fail"), ("reason", "other")]
        ),
        0
    );
}

#[test]
fn batches_count_each_task() {
    let seen = observe(|store, clock| async move {
        let a = store.submit(task_in("tenant-1", "a")).await?.into_task();
        let b = store.submit(task_in("tenant-1", "b")).await?.into_task();
        let c = store.submit(task_in("tenant-1", "c")).await?.into_task();
        let claims = store
            .claim_many(&[a.id, b.id, c.id, TaskId::new()], ClaimRequest::new("w", LEASE))
            .await?;
        let mut leases: Vec<Lease> = claims
            .into_iter()
            .filter_map(|c| match c {
                Claim::Acquired(lease) => Some(lease),
                _ => None,
            })
            .collect();
        assert_eq!(leases.len(), 3);
        let lease_c = leases.pop().unwrap();
        // c's lease expires and is taken over: its batch item is superseded.
        clock.advance(LEASE * 2);
        let again = store
            .claim_many(&[a.id, c.id], ClaimRequest::new("w2", LEASE))
            .await?;
        assert!(again.iter().all(Claim::is_acquired));
        let Claim::Acquired(fresh_a) = again.into_iter().next().unwrap() else {
            unreachable!()
        };
        let lease_b = leases.pop().unwrap();
        let results = store
            .complete_many(vec![
                (fresh_a, Response::from("a")),
                (lease_b, Response::from("b")),
                (lease_c, Response::from("c")),
            ])
            .await?;
        assert!(results[0].as_ref().unwrap().is_accepted());
        assert_eq!(
            results[1].as_ref().unwrap().rejection(),
            Some(&Rejection::LeaseExpired)
        );
        assert!(matches!(
            results[2].as_ref().unwrap().rejection(),
            Some(Rejection::Superseded { .. })
        ));
        Ok(())
    });
    let m = &seen.metrics;
    assert_eq!(m.ops("claim_many", "acquired", None), 5);
    assert_eq!(m.ops("claim_many", "not_found", None), 1);
    assert_eq!(m.ops("complete_many", "accepted", None), 1);
    assert_eq!(m.ops("complete_many", "rejected", Some("lease_expired")), 1);
    assert_eq!(m.ops("complete_many", "rejected", Some("superseded")), 1);
    assert_eq!(m.samples("claim_many"), 2, "one sample per batch call");
    assert_eq!(m.samples("complete_many"), 1);
    // The backend's own claims are not counted again under `claim`.
    assert_eq!(m.ops("claim", "acquired", None), 0);
    let batch = seen.spans("taskfence.claim_many");
    assert_eq!(batch.len(), 2);
    assert_eq!(batch[0].field("batch"), Some("4"));
    assert_eq!(batch[0].field("outcome"), Some("ok"));
}

// ---------------------------------------------------------------------------
// Spans.

#[test]
fn spans_are_named_per_operation_with_task_fields() {
    let mut id = None;
    let seen = observe(|store, clock| {
        let id = &mut id;
        async move {
            let task = store.submit(task_in("tenant-1", "a")).await?.into_task();
            *id = Some(task.id);
            let first = acquire(&store, task.id, "w1").await;
            clock.advance(LEASE * 2);
            let second = acquire(&store, task.id, "w2").await;
            let _ = store.complete(first, Response::from("late")).await?;
            let _ = store.complete(second, Response::from("ok")).await?;
            let _ = store.cancel(TaskId::new(), "gone").await;
            Ok(())
        }
    });
    let id = id.unwrap().to_string();

    let submit = seen.spans("taskfence.submit");
    assert_eq!(submit.len(), 1);
    assert_eq!(submit[0].level, Some(Level::INFO));
    assert_eq!(submit[0].field("task_id"), Some(id.as_str()));
    assert_eq!(submit[0].field("outcome"), Some("created"));
    assert_eq!(submit[0].field("scope"), Some("tenant-1"));
    assert_eq!(submit[0].field("operation"), Some("chat.reply"));

    let claims = seen.spans("taskfence.claim");
    assert_eq!(claims.len(), 2);
    for (span, n) in claims.iter().zip(["1", "2"]) {
        assert_eq!(span.field("task_id"), Some(id.as_str()));
        assert_eq!(span.field("version"), Some(n));
        assert_eq!(span.field("attempt"), Some(n));
        assert_eq!(span.field("scope"), Some("tenant-1"));
        assert_eq!(span.field("operation"), Some("chat.reply"));
        assert_eq!(span.field("outcome"), Some("acquired"));
    }

    let completes = seen.spans("taskfence.complete");
    assert_eq!(completes.len(), 2);
    assert_eq!(completes[0].field("version"), Some("1"));
    assert_eq!(completes[0].field("outcome"), Some("rejected"));
    assert_eq!(completes[0].field("reason"), Some("superseded"));
    assert_eq!(completes[1].field("version"), Some("2"));
    assert_eq!(completes[1].field("attempt"), Some("2"));
    assert_eq!(completes[1].field("outcome"), Some("accepted"));
    assert_eq!(completes[1].field("reason"), None);

    let cancel = seen.spans("taskfence.cancel");
    assert_eq!(cancel[0].field("outcome"), Some("error"));
    assert_eq!(cancel[0].field("reason"), Some("not_found"));
    assert_eq!(cancel[0].field("scope"), None, "an unknown task has no scope");

    // The backend's own debug spans stay, inside the wrapper's.
    let inner: Vec<_> = seen
        .spans
        .iter()
        .filter(|s| s.name == "taskfence" && s.field("op") == Some("complete"))
        .collect();
    assert_eq!(inner.len(), 2);
    assert!(
        inner
            .iter()
            .all(|s| s.parent.as_deref() == Some("taskfence.complete"))
    );
    assert_eq!(inner[0].level, Some(Level::DEBUG));
}

// ---------------------------------------------------------------------------
// The state sampler's gauges, from PostgreSQL.

/// Tasks in three statuses and two scopes, one stranded: the sampler's
/// gauges say so, per status over every scope and in the scope it names.
#[test]
fn state_sampler_sets_its_gauges_from_postgres() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fixture = runtime.block_on(taskfence_test_support::fixture());
    let store = fixture.pg_store().clone();
    let key =
        |scope: &str, k: &str| NewTask::new(RequestKey::new(scope, "chat.reply", k), InputHash::of([k]));
    let state = ::metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let lost = store.submit(key("tenant-a", "lost")).await.unwrap().into_task();
            fixture.advance(Duration::from_secs(120)).await;
            store.submit(key("tenant-a", "fresh")).await.unwrap();
            let running = store
                .submit(key("tenant-b", "running"))
                .await
                .unwrap()
                .into_task();
            let _lease = acquire(&store, running.id, "w").await;
            let done = store.submit(key("tenant-b", "done")).await.unwrap().into_task();
            let lease = acquire(&store, done.id, "w").await;
            assert!(
                store
                    .complete(lease, Response::from("ok"))
                    .await
                    .unwrap()
                    .is_accepted()
            );
            let state = metrics::StateSampler::new()
                .stranded_after(Duration::from_secs(60))
                .scopes(["tenant-b"])
                .sample(&store)
                .await
                .unwrap();
            assert_eq!(state.stranded, 1, "{lost:?} waited past the threshold");
            state
        })
    });
    assert_eq!(state.counts.get(Status::Pending), 2);
    assert!(state.oldest_pending_age.is_some());

    let mut gauges: HashMap<(String, Vec<(String, String)>), f64> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        if let DebugValue::Gauge(v) = value {
            gauges.insert(Recorded::key(key.name(), &labels), v.into_inner());
        }
    }
    let gauge = |name: &str, labels: &[(&str, &str)]| gauges.get(&Recorded::key(name, labels)).copied();
    let all = |status: &str| gauge(metrics::TASKS, &[("status", status), ("scope", "*")]);
    assert_eq!(
        (all("pending"), all("running"), all("completed"), all("failed")),
        (Some(2.0), Some(1.0), Some(1.0), Some(0.0))
    );
    let b = |status: &str| gauge(metrics::TASKS, &[("status", status), ("scope", "tenant-b")]);
    assert_eq!(
        (b("pending"), b("running"), b("completed")),
        (Some(0.0), Some(1.0), Some(1.0))
    );
    assert_eq!(gauge(metrics::STRANDED_TASKS, &[]), Some(1.0));
    assert!(gauge(metrics::OLDEST_PENDING_AGE_SECONDS, &[]).is_some_and(|age| age >= 0.0));
    runtime.block_on(async move { drop(fixture) });
}
