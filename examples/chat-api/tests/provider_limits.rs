//! The provider's limits, kept by the store for every worker: one
//! conversation's messages are answered one at a time, in the order they
//! were sent (a concurrency key of limit 1), while other conversations'
//! replies run beside them; and a provider's `429 Retry-After` stops every
//! worker until then (the shared rate bucket is drained), costing the other
//! replies no attempt.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chat_api::{Mode, ReplyProvider};
use support::{ALICE, TestDb, TestService, config, ids};
use taskfence::Failure;

/// One provider call: the prompt, when it started and ended, how it answered.
#[derive(Debug, Clone)]
struct Call {
    prompt: String,
    started: Instant,
    ended: Instant,
    answered: bool,
}

/// A provider that records every call; with `throttle_first`, its first
/// call answers `429` with `Retry-After: 2s`.
#[derive(Clone)]
struct Recording {
    calls: Arc<Mutex<Vec<Call>>>,
    latency: Duration,
    throttle_first: bool,
}

impl Recording {
    fn new(latency: Duration, throttle_first: bool) -> Self {
        Self {
            calls: Arc::default(),
            latency,
            throttle_first,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl ReplyProvider for Recording {
    async fn reply(&self, prompt: &str, attempt: u32) -> Result<String, Failure> {
        let started = Instant::now();
        let first = self.calls.lock().unwrap().is_empty();
        tokio::time::sleep(self.latency).await;
        let answered = !(self.throttle_first && first);
        self.calls.lock().unwrap().push(Call {
            prompt: prompt.to_owned(),
            started,
            ended: Instant::now(),
            answered,
        });
        if answered {
            Ok(format!("Reply to: {prompt} (attempt {attempt})"))
        } else {
            Err(Failure::retryable("429 Too Many Requests").retry_after(Duration::from_secs(2)))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_conversations_messages_are_answered_one_at_a_time_in_order() {
    let db = TestDb::new().await;
    let provider = Recording::new(Duration::from_millis(400), false);
    let mut config = config(&db, Mode::Both);
    config.worker.concurrency = 4;
    let service = TestService::start_with_provider(&db, config, provider.clone()).await;
    let api = service.api().clone();

    let mut tasks = Vec::new();
    for (conversation, prompt) in [
        ("conv-a", "a1"),
        ("conv-a", "a2"),
        ("conv-b", "b1"),
        ("conv-a", "a3"),
    ] {
        let sent = api.send(ALICE, conversation, Some(prompt), prompt).await;
        assert_eq!(sent.status, 201, "{}", String::from_utf8_lossy(&sent.body));
        tasks.push(ids(&sent).0);
    }
    for task in &tasks {
        let view = api.wait_for_reply(ALICE, task).await;
        assert_eq!(view["attempts"], 1, "waiting for its turn costs no attempt");
    }
    service.stop().await;

    let calls = provider.calls();
    let a: Vec<&Call> = calls.iter().filter(|c| c.prompt.starts_with('a')).collect();
    let order: Vec<&str> = a.iter().map(|c| c.prompt.as_str()).collect();
    assert_eq!(order, ["a1", "a2", "a3"], "in the order sent, each once");
    for pair in a.windows(2) {
        assert!(
            pair[1].started >= pair[0].ended,
            "{} started before {} ended",
            pair[1].prompt,
            pair[0].prompt
        );
    }
    let b = calls.iter().find(|c| c.prompt == "b1").expect("b1 answered");
    assert!(
        a.iter().any(|c| b.started < c.ended && c.started < b.ended),
        "another conversation's reply runs beside them: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429_with_retry_after_stops_every_worker_until_then() {
    let db = TestDb::new().await;
    let provider = Recording::new(Duration::from_millis(50), true);
    let mut config = config(&db, Mode::Both);
    config.worker.concurrency = 4;
    let service = TestService::start_with_provider(&db, config, provider.clone()).await;
    let api = service.api().clone();

    let first = ids(&api.send(ALICE, "conv-a", Some("first"), "first").await).0;
    // Once the provider has answered 429, another conversation's message.
    let deadline = Instant::now() + Duration::from_secs(30);
    while provider.calls().is_empty() {
        assert!(Instant::now() < deadline, "the first call never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let throttled_at = provider.calls()[0].ended;
    let second = ids(&api.send(ALICE, "conv-b", Some("second"), "second").await).0;

    let view = api.wait_for_reply(ALICE, &second).await;
    assert_eq!(view["attempts"], 1, "the drained bucket cost it no attempt");
    let view = api.wait_for_reply(ALICE, &first).await;
    assert_eq!(view["attempts"], 2, "the 429, then the answer");
    service.stop().await;

    let calls = provider.calls();
    assert!(
        !calls[0].answered && calls[1..].iter().all(|c| c.answered),
        "{calls:?}"
    );
    for call in &calls[1..] {
        assert!(
            call.started >= throttled_at + Duration::from_millis(1900),
            "{} called {:?} after the 429, inside its Retry-After",
            call.prompt,
            call.started - throttled_at
        );
    }
}
