//! A supervisor for several workers, standing in for the process manager
//! (systemd, Kubernetes) that restarts a worker process when it dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::task::JoinSet;

use taskfence_sqs::SqsWorker;

use crate::Provider;
use crate::sim::chaos::KillSwitch;
use crate::worker::work;

/// Workers running in this process. A worker whose [`KillSwitch`] is pulled
/// is dead on the spot: its store and SQS calls fail from then on, so every
/// message in its hands stays as it was (nothing saved, nothing deleted:
/// exactly what a killed process leaves behind). The fleet then ends what is
/// left of it (its tasks, its timers) and starts a new worker with a new id.
pub struct Fleet {
    running: JoinSet<()>,
    shutdown: watch::Sender<bool>,
    kills: Arc<AtomicU64>,
}

impl Fleet {
    /// Starts `size` workers. `make(worker_id, kill)` builds each incarnation,
    /// with `kill` on its store and its queue, and the provider its work calls.
    pub fn start<M>(size: usize, make: M) -> Self
    where
        M: Fn(String, KillSwitch) -> (SqsWorker, Arc<dyn Provider>) + Send + Sync + 'static,
    {
        let (shutdown, stopping) = watch::channel(false);
        let kills = Arc::new(AtomicU64::new(0));
        let make = Arc::new(make);
        let mut running = JoinSet::new();
        for slot in 0..size {
            let (make, mut stopping, kills) = (Arc::clone(&make), stopping.clone(), Arc::clone(&kills));
            running.spawn(async move {
                for incarnation in 0.. {
                    let kill = KillSwitch::new();
                    let (worker, provider) = make(format!("worker-{slot}.{incarnation}"), kill.clone());
                    let stop = worker.stop().clone();
                    let run = worker.run(move |ctx| work(ctx, Arc::clone(&provider)));
                    tokio::pin!(run);
                    tokio::select! {
                        _ = &mut run => break,
                        () = async { _ = stopping.wait_for(|stop| *stop).await; } => {
                            stop.request();
                            let _ = run.await;
                            break;
                        }
                        () = kill.pulled() => {
                            stop.now();
                            let _ = run.await;
                            kills.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(slot, incarnation, "worker killed; starting a new one");
                        }
                    }
                }
            });
        }
        Self {
            running,
            shutdown,
            kills,
        }
    }

    /// Workers killed so far.
    pub fn kills(&self) -> u64 {
        self.kills.load(Ordering::Relaxed)
    }

    /// Asks every worker to stop receiving and finish the messages in hand, and waits.
    pub async fn stop(mut self) -> u64 {
        let _ = self.shutdown.send(true);
        while self.running.join_next().await.is_some() {}
        self.kills()
    }
}
