//! Scaffolding, not the service: runs the template once against a broker,
//! in one process on an in-memory store: submits some tasks, hands them off,
//! consumes them with one reply consumer and the simulated LLM, prints the
//! saved replies.
//!
//! ```text
//! TASKFENCE_KAFKA_BOOTSTRAP=127.0.0.1:9092 TASKS=20 cargo run -p kafka-worker --bin kafka-worker-demo
//! ```

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use kafka_worker::sim::SimulatedLlm;
use kafka_worker::work_with;
use taskfence::runtime::ConsumerConfig;
use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskId, TaskStore};
use taskfence_kafka::{Handoffs, KafkaConfig, ReplyConsumer, TracingJournal, ensure_topic};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    if let Some(unknown) = taskfence::config::unknown_env(&["TASKFENCE_KAFKA_BOOTSTRAP"]) {
        tracing::warn!("{unknown}");
    }
    let bootstrap = std::env::var("TASKFENCE_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let count: usize = std::env::var("TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let run = TaskId::new();
    let topic = format!("handoffs-{run}");
    ensure_topic(&bootstrap, &topic, 4).await?;

    let journal = Arc::new(TracingJournal);
    let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
    let mut ids = Vec::new();
    for i in 0..count {
        let key = RequestKey::new("demo-user", "chat.reply", format!("req-{i}"));
        let task = NewTask::new(key, InputHash::of([format!("message {i}")])).payload(format!("message {i}"));
        ids.push(store.submit(task).await?.into_task().id);
    }

    let provider = Arc::new(SimulatedLlm::new(
        Duration::from_millis(50),
        Duration::from_millis(300),
    ));
    let kafka = KafkaConfig::new(&bootstrap, format!("reply-workers-{run}"), &topic, "demo-worker");
    let consumer = ReplyConsumer::spawn(
        kafka,
        Arc::clone(&store),
        ConsumerConfig::new("demo-worker", Duration::from_secs(30)),
        journal.clone(),
        work_with(provider, journal.clone(), "demo-worker"),
    )?;

    // The in-memory store has no outbox: publish directly.
    let handoffs = Handoffs::new(&bootstrap, &topic, journal)?;
    for id in &ids {
        // Just submitted, never claimed: assignment version 0.
        handoffs.publish(taskfence::wire::Stamp::new(*id, 0)).await?;
    }
    println!("handed off {count} tasks to {topic}; waiting for replies (the group join can take ~20 s)");
    loop {
        let mut settled = 0;
        for id in &ids {
            settled += usize::from(store.get(*id).await?.is_some_and(|t| t.status.is_terminal()));
        }
        if settled == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    consumer.shutdown().await;
    for id in &ids {
        let task = store.get(*id).await?.expect("submitted");
        let reply = task.response.as_ref().and_then(|r| r.as_str()).unwrap_or("-");
        println!("{id} {} {reply}", task.status);
    }
    Ok(())
}
