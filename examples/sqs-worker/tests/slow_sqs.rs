//! Stopping against a slow SQS: the service reaches SQS through a proxy that
//! holds every answer back for seconds. After SIGTERM, sent just after a
//! receive went out, it still exits 0 within the grace plus the release
//! deadline (the receive is abandoned, the last SQS calls get what is left of
//! that time), and every task it held is released in the store; the messages
//! come back on their own.

mod support;

use std::time::{Duration, Instant};

use sqs_worker::sim::local_sqs_client;
use sqs_worker::{Dispatcher, SqsQueue};
use taskfence::store::AttemptOutcome;
use taskfence::testing::Fixture;
use taskfence::{InputHash, NewTask, RequestKey, Status, TaskId};
use taskfence_test_support::{eventually_every, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use support::{Moto, start_service};

/// A TCP proxy to `upstream` (`host:port`) that holds back everything the
/// upstream sends for `delay`; returns the proxy's `host:port` and a count
/// of the `ReceiveMessage` requests it has passed on.
async fn slow_proxy(upstream: String, delay: Duration) -> (String, watch::Receiver<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (receives, counted) = watch::channel(0);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, receives) = (upstream.clone(), receives.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let requests = async {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                        // The JSON protocol names the operation in a header.
                        if buf[..n].windows(14).any(|w| w == b"ReceiveMessage") {
                            receives.send_modify(|n| *n += 1);
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                };
                let (held, mut release) = mpsc::unbounded_channel();
                let answers = async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                        let _ = held.send((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
                    }
                };
                let delayed = async {
                    while let Some((at, bytes)) = release.recv().await {
                        tokio::time::sleep_until(at).await;
                        if to_client.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                };
                tokio::join!(requests, answers, delayed);
            });
        }
    });
    (addr, counted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_slow_sqs_exits_within_the_grace_and_the_release_deadline() {
    let moto = Moto::start_or_env();
    let client = local_sqs_client(&moto.endpoint).await;
    let name = format!("taskfence-slow-sqs-{}", uuid::Uuid::now_v7());
    let queue = SqsQueue::create(client, &name, Duration::from_secs(5))
        .await
        .expect("create the queue");
    let fixture = fixture().await;
    let run = TaskId::new();
    let mut ids = Vec::new();
    for i in 0..4 {
        let key = RequestKey::new("workspace-1", "chat.reply", format!("{run}-{i}"));
        let task =
            NewTask::new(key, InputHash::of([format!("message-{i}")])).payload(format!("question #{i}"));
        ids.push(fixture.store().submit(task).await.unwrap().into_task().id);
    }
    let dispatcher = Dispatcher::new(fixture.pg_store().clone(), queue.clone(), 50);
    assert_eq!(dispatcher.round().await.unwrap().len(), ids.len());

    // Every SQS answer reaches the service this late.
    let delay = Duration::from_secs(3);
    let upstream = moto.endpoint.trim_start_matches("http://").trim_end_matches('/');
    let (proxy, mut receives) = slow_proxy(upstream.to_owned(), delay).await;
    let proxy = Moto::behind(format!("http://{proxy}"));
    let (grace, release_deadline) = (Duration::from_secs(2), Duration::from_secs(2));
    let mut service = start_service(
        "slow-sqs-1",
        &proxy,
        fixture.url(),
        fixture.schema(),
        queue.url(),
        &[
            "--provider",
            "simulated",
            // Calls that outlast the grace: every task has to be released.
            "--sim-min-latency",
            "60s",
            "--sim-max-latency",
            "60s",
            // Slots to spare, so a receive is always in flight, held back by the proxy.
            "--concurrency",
            "8",
            "--lease",
            "6s",
            "--visibility-slack",
            "1s",
            "--poll-wait",
            "2s",
            "--shutdown-grace",
            "2s",
            "--release-deadline",
            "2s",
        ],
    );

    // Every task's provider call has started (its operation id is recorded).
    eventually_every(Duration::from_secs(60), Duration::from_millis(100), || async {
        for &id in &ids {
            let attempts = fixture.store().attempts(id).await.unwrap();
            attempts.last().and_then(|a| a.operation_id.as_ref())?;
        }
        Some(())
    })
    .await;
    // A renewal (every 2 s) or two: visibility extensions queue up behind the proxy.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Just after a receive went out: it would hold the stop for the long poll
    // and the delay (5 s) if the stop let it finish.
    receives.borrow_and_update();
    receives.changed().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let signalled = Instant::now();
    service.signal("TERM");
    let status = service
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the service did not exit after SIGTERM");
    let took = signalled.elapsed();
    assert!(status.success(), "the service exited with {status}");
    assert!(
        took <= grace + release_deadline + Duration::from_millis(1500),
        "exit took {took:?}: past the {grace:?} grace and the {release_deadline:?} release deadline"
    );

    // Every task given back: pending, its one attempt closed `released`, no lease.
    for &id in &ids {
        let task = fixture.store().get(id).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Pending, "{id}");
        assert!(task.lease_until.is_none(), "{id}: no live lease");
        let outcomes: Vec<_> = fixture
            .store()
            .attempts(id)
            .await
            .unwrap()
            .iter()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(outcomes, [AttemptOutcome::Released], "{id}");
    }
    // Nothing lost in SQS: every message is visible again, at once or when
    // its visibility runs out.
    eventually_every(Duration::from_secs(30), Duration::from_millis(500), || async {
        let depth = queue.depth().await.unwrap();
        (depth.visible == ids.len() as u64 && depth.in_flight == 0).then_some(())
    })
    .await;
    println!(
        "SQS answering {delay:?} late: exit 0 after {took:.1?}, {} tasks released",
        ids.len()
    );
    queue.delete_queue().await.unwrap();
}
