//! A supervisor for several workers, standing in for the process manager
//! (systemd, Kubernetes) that restarts a worker process when it dies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::sim::chaos::KillSwitch;
use crate::worker::SqsWorker;

/// Workers running in this process. A worker whose [`KillSwitch`] is pulled
/// is dropped on the spot, with every message in its hands (nothing saved,
/// nothing deleted: exactly what a killed process leaves behind), and a new
/// worker with a new id takes its place.
pub struct Fleet {
    running: JoinSet<()>,
    shutdown: watch::Sender<bool>,
    kills: Arc<AtomicU64>,
}

impl Fleet {
    /// Starts `size` workers. `make(worker_id, kill)` builds each incarnation.
    pub fn start<M>(size: usize, make: M) -> Self
    where
        M: Fn(String, KillSwitch) -> SqsWorker + Send + Sync + 'static,
    {
        let (shutdown, stop) = watch::channel(false);
        let kills = Arc::new(AtomicU64::new(0));
        let make = Arc::new(make);
        let mut running = JoinSet::new();
        for slot in 0..size {
            let (make, stop, kills) = (Arc::clone(&make), stop.clone(), Arc::clone(&kills));
            running.spawn(async move {
                for incarnation in 0.. {
                    let kill = KillSwitch::new();
                    let worker = make(format!("worker-{slot}.{incarnation}"), kill.clone());
                    tokio::select! {
                        _ = worker.run(stop.clone()) => break,
                        _ = kill.pulled() => {
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

    /// Asks every worker to stop polling and finish the messages in hand, and waits.
    pub async fn stop(mut self) -> u64 {
        let _ = self.shutdown.send(true);
        while self.running.join_next().await.is_some() {}
        self.kills()
    }
}
