//! The service's Prometheus endpoint (`--metrics-addr`) and its republish
//! loop, against moto's SQS and PostgreSQL: after the service has processed
//! some messages, `/metrics` counts them; a task whose message is gone and
//! whose lease expired is re-published by the service and finished.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sqs_worker::sim::local_sqs_client;
use sqs_worker::{Dispatcher, SqsQueue};
use taskfence::testing::{Fixture, PgFixture};
use taskfence::{Claim, ClaimRequest, InputHash, NewTask, RequestKey, Status, TaskId};
use taskfence_test_support::{eventually_every, fixture, free_port};

use support::{Moto, start_service};

async fn new_queue(moto: &Moto, prefix: &str) -> SqsQueue {
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("{prefix}-{}", uuid::Uuid::now_v7());
    SqsQueue::create(client, &name, Duration::from_secs(5))
        .await
        .expect("create the queue")
}

async fn submit(fixture: &PgFixture, key: String) -> TaskId {
    let task = NewTask::new(
        RequestKey::new("workspace-1", "chat.reply", &key),
        InputHash::of([&key]),
    )
    .payload(format!("question {key}"));
    fixture.store().submit(task).await.unwrap().into_task().id
}

/// `GET /metrics` over plain HTTP/1.0 (no chunked body); `None` while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    assert!(
        response.starts_with("HTTP/1.") && response.contains(" 200 "),
        "the endpoint answered {response:?}"
    );
    Some(response)
}

/// The value of the sample whose name and labels are exactly `series`
/// (`name{label="value",…}`, labels in the exporter's order).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum over every sample of metric `name` whose labels contain all of `labels`.
fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') && labels.iter().all(|l| rest.contains(l)))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_counts_what_the_service_did_and_due_tasks_are_republished() {
    let moto = Moto::start_or_env();
    let queue = new_queue(&moto, "taskfence-metrics").await;
    let fixture = fixture().await;

    // A task whose message is gone: its handoff was published elsewhere,
    // then a worker claimed it and vanished. Only the republish loop finds it.
    let lost = submit(&fixture, format!("lost-{}", TaskId::new())).await;
    let elsewhere = new_queue(&moto, "taskfence-metrics-elsewhere").await;
    let outbox = Dispatcher::new(fixture.pg_store().clone(), elsewhere.clone(), 50);
    assert_eq!(outbox.round().await.unwrap(), vec![lost]);
    let claim = fixture
        .store()
        .claim(lost, ClaimRequest::new("vanished", Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired(_)));

    // New work, published by the service's own dispatcher.
    let run = TaskId::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(submit(&fixture, format!("{run}-{i}")).await);
    }

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut service = start_service(
        "metrics-1",
        &moto,
        fixture.url(),
        fixture.schema(),
        queue.url(),
        &[
            "--provider",
            "simulated",
            "--sim-min-latency",
            "10ms",
            "--sim-max-latency",
            "50ms",
            "--lease",
            "4s",
            "--poll-wait",
            "1s",
            "--dispatch",
            "true",
            "--dispatch-idle",
            "200ms",
            "--redispatch-interval",
            "1s",
            "--metrics-addr",
            &addr,
        ],
    );

    ids.push(lost);
    eventually_every(Duration::from_secs(60), Duration::from_millis(200), || async {
        for &id in &ids {
            if fixture.store().get(id).await.unwrap().unwrap().status != Status::Completed {
                return None;
            }
        }
        Some(())
    })
    .await;
    let lost_task = fixture.store().get(lost).await.unwrap().unwrap();
    assert_eq!(
        lost_task.attempts(),
        2,
        "finished by the service on a second attempt"
    );
    assert_eq!(
        elsewhere.depth().await.unwrap().total(),
        1,
        "the only message the lost task ever had stayed elsewhere"
    );

    let text = eventually_every(Duration::from_secs(10), Duration::from_millis(100), || async {
        scrape(port)
    })
    .await;
    // Each of the six tasks saved once, by this service alone (the consumer
    // group-commits: one `complete_many` sample per saved task).
    assert_eq!(
        sample(
            &text,
            r#"taskfence_operations_total{operation="complete_many",outcome="accepted"}"#
        ),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        sum(&text, "taskfence_operations_total", &[r#"operation="complete""#]),
        0.0,
        "no completion outside the group commit: {text}"
    );
    assert!(text.contains("# HELP taskfence_operations_total"), "{text}");
    assert!(
        text.contains("# TYPE taskfence_operations_total counter"),
        "{text}"
    );
    // Claims (one `claim_many` per receive) acquired each task once.
    assert_eq!(
        sum(&text, "taskfence_operations_total", &[r#"outcome="acquired""#]),
        6.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"taskfence_operations_total{operation="due",outcome="ok"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, r#"taskfence_tasks_redispatched_total{source="due"}"#).is_some_and(|n| n >= 1.0),
        "{text}"
    );
    // One latency sample per `complete_many` call: between one (all six in
    // one batch) and six.
    let commits = sum(
        &text,
        "taskfence_operation_duration_seconds_count",
        &[r#"operation="complete_many""#],
    );
    assert!((1.0..=6.0).contains(&commits), "{text}");
    // A histogram with buckets (aggregatable across replicas), not a summary.
    assert!(
        text.contains("# TYPE taskfence_operation_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        sum(
            &text,
            "taskfence_operation_duration_seconds_bucket",
            &[r#"operation="complete_many""#, r#"le="+Inf""#],
        ) == commits,
        "every sample in the +Inf bucket: {text}"
    );
    println!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("taskfence_operations_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    service.signal("TERM");
    let status = service
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the service exits after SIGTERM");
    assert!(status.success(), "exited with {status}");
    queue.delete_queue().await.unwrap();
    elsewhere.delete_queue().await.unwrap();
}
