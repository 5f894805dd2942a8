//! One trace from the HTTP handler to the worker: the handler's span, the
//! submission inside it, then — after the queue — the worker's `process`
//! span as its child and the work inside that, caught by an in-memory
//! OpenTelemetry exporter. A retry is a new trace that links back.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use opentelemetry::trace::{SpanId, Status as SpanStatus, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use taskfence::runtime::{ConsumerConfig, StoreQueue};
use taskfence::{
    Failure, InputHash, MemoryStore, NewTask, RequestKey, Response, RetryPolicy, Status, TaskStore,
};
use tracing_subscriber::layer::SubscriberExt;

/// The handler, in the server span `request_span` opens: the submission inside it.
async fn post_message(State(submit): State<Arc<dyn TaskStore>>, body: String) -> String {
    let new = NewTask::new(
        RequestKey::new("user-1", "chat.reply", &body),
        InputHash::of([body.as_str()]),
    )
    .policy(
        RetryPolicy::default()
            .jitter(0.0)
            .initial_backoff(Duration::from_millis(10)),
    )
    .without_handoff();
    let task = submit.submit(new).await.expect("submit").into_task();
    task.id.to_string()
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_handler_through_submission_to_the_workers_completion() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("taskfence-test")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this binary");

    let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    let queue = StoreQueue::new(store.clone());
    let app = Router::new()
        .route("/messages", post(post_message))
        .route_layer(axum::middleware::from_fn(taskfence_axum::trace::request_span))
        .with_state(queue.submitter());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let consumer = queue
        .consumer(ConsumerConfig::new("worker-1", Duration::from_secs(30)))
        .unwrap();
    let stop = consumer.stop().clone();
    let worker = tokio::spawn(consumer.run(|ctx| async move {
        // The provider call, inside the worker's `process` span.
        let _call = tracing::info_span!("provider.call").entered();
        if ctx.task().key.key == "flaky" && ctx.lease().attempt() == 1 {
            return Err(Failure::retryable("provider overloaded"));
        }
        Ok(Response::from("the reply"))
    }));

    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for body in ["hello", "flaky"] {
        let id = http
            .post(format!("http://{addr}/messages"))
            .body(body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        ids.push(id.parse::<taskfence::TaskId>().unwrap());
    }
    for id in &ids {
        taskfence_wait(&*store, *id).await;
    }
    stop.request();
    worker.await.unwrap().unwrap();
    server.abort();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    // The first request: handler → submit → process → provider call, one trace.
    let handlers = named(&spans, "POST /messages");
    assert_eq!(
        handlers.len(),
        2,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for handler in &handlers {
        assert_eq!(attribute(handler, "http.route").as_deref(), Some("/messages"));
        assert_eq!(attribute(handler, "http.request.method").as_deref(), Some("POST"));
        assert_eq!(
            attribute(handler, "http.response.status_code").as_deref(),
            Some("200")
        );
    }
    let processes = named(&spans, "process chat.reply");
    let hello = |s: &&SpanData| attribute(s, "messaging.message.id") == Some(ids[0].to_string());
    let process = processes
        .iter()
        .copied()
        .find(hello)
        .expect("the hello task's process span");
    let handler = handlers
        .iter()
        .copied()
        .find(|h| h.span_context.trace_id() == process.span_context.trace_id())
        .expect("the process span is in its handler's trace");
    assert_eq!(
        process.parent_span_id,
        handler.span_context.span_id(),
        "a child of the handler's span"
    );
    assert!(process.parent_span_is_remote, "joined through the stored context");
    assert_eq!(process.span_kind, opentelemetry::trace::SpanKind::Consumer);
    assert_eq!(process.status, SpanStatus::Ok, "the response was saved");
    assert_eq!(
        attribute(process, "messaging.system").as_deref(),
        Some("taskfence")
    );
    assert_eq!(
        attribute(process, "messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(
        attribute(process, "messaging.destination.name").as_deref(),
        Some("chat.reply")
    );
    let submit = spans
        .iter()
        .find(|s| {
            s.span_context.trace_id() == handler.span_context.trace_id()
                && attribute(s, "op").as_deref() == Some("submit")
        })
        .expect("the store's submit span");
    assert_eq!(submit.parent_span_id, handler.span_context.span_id());
    let call = spans
        .iter()
        .find(|s| s.name == "provider.call" && s.parent_span_id == process.span_context.span_id())
        .expect("the work inside the process span");
    assert_eq!(call.span_context.trace_id(), handler.span_context.trace_id());

    // The flaky request: the first attempt joins its handler's trace and
    // fails; the retry is a trace of its own that links back to the handler.
    let flaky: Vec<&SpanData> = processes
        .iter()
        .copied()
        .filter(|s| attribute(s, "messaging.message.id") == Some(ids[1].to_string()))
        .collect();
    assert_eq!(flaky.len(), 2, "two attempts");
    let first = flaky
        .iter()
        .find(|s| attribute(s, "taskfence.attempt").as_deref() == Some("1"))
        .unwrap();
    let retry = flaky
        .iter()
        .find(|s| attribute(s, "taskfence.attempt").as_deref() == Some("2"))
        .unwrap();
    let flaky_handler = handlers
        .iter()
        .find(|h| h.span_context.trace_id() == first.span_context.trace_id())
        .expect("the first attempt is in its handler's trace");
    assert!(matches!(first.status, SpanStatus::Error { .. }));
    assert_eq!(attribute(first, "error.type").as_deref(), Some("retryable"));
    assert_ne!(
        retry.span_context.trace_id(),
        first.span_context.trace_id(),
        "a retry starts its own trace"
    );
    assert_eq!(retry.parent_span_id, SpanId::INVALID);
    let links: Vec<(TraceId, SpanId)> = retry
        .links
        .links
        .iter()
        .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
        .collect();
    assert_eq!(
        links,
        [(
            flaky_handler.span_context.trace_id(),
            flaky_handler.span_context.span_id()
        )],
        "linked to the request"
    );
    assert_eq!(retry.status, SpanStatus::Ok);
}

async fn taskfence_wait(store: &dyn TaskStore, id: taskfence::TaskId) {
    for _ in 0..500 {
        if store.get(id).await.unwrap().unwrap().status == Status::Completed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {id} was not completed");
}
