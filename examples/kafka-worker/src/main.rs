//! Runs the template once against a broker: submits some tasks, hands them off,
//! consumes them with one reply consumer, prints the saved replies.
//!
//! ```text
//! KAFKA_BOOTSTRAP=127.0.0.1:9092 TASKS=20 cargo run -p kafka-worker
//! ```
//!
//! The store here is in memory, so dispatcher and consumer share one process;
//! with `PgStore` they can run as separate processes against one database.

use std::sync::Arc;
use std::time::Duration;

use kafka_worker::{ConsumerConfig, Dispatcher, ReplyConsumer, SimulatedLlm, TracingJournal, ensure_topic};
use taskfence::runtime::{Worker, WorkerConfig};
use taskfence::{InputHash, MemoryStore, NewTask, RequestKey, TaskId, TaskStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bootstrap = std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
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

    let worker = Worker::new(
        Arc::clone(&store),
        WorkerConfig::new("demo-worker", Duration::from_secs(30)),
    )?;
    let provider = Arc::new(SimulatedLlm::new(
        journal.clone(),
        Duration::from_millis(50),
        Duration::from_millis(300),
    ));
    let config = ConsumerConfig::new(&bootstrap, format!("reply-workers-{run}"), &topic, "demo-worker");
    let consumer = ReplyConsumer::spawn(config, worker, provider, journal.clone())?;

    let dispatcher = Dispatcher::new(&bootstrap, &topic, journal)?;
    for id in &ids {
        dispatcher.publish(*id).await?;
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
