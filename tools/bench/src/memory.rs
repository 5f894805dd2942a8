//! `MemoryStore` operations per second: the same lifecycle, in process.

use std::sync::Arc;

use taskfence::{MemoryStore, TaskStore};

use crate::lifecycle::{burst, ours};
use crate::report::Report;
use crate::{Config, Res};

pub(crate) async fn run(cfg: &Config, report: &mut Report) -> Res<()> {
    let mut rows = Vec::new();
    for workers in [1, 8] {
        // A fresh store per measurement, so its maps start empty.
        let store: Arc<dyn TaskStore> = Arc::new(MemoryStore::new());
        let lifecycles = burst(workers, cfg.memory_secs, move |key| {
            let store = store.clone();
            async move { ours(&*store, &key).await }
        })
        .await?;
        rows.push(vec![
            workers.to_string(),
            format!("{lifecycles:.0}"),
            format!("{:.0}", 3.0 * lifecycles),
        ]);
    }
    report.section(
        "MemoryStore",
        &format!(
            "The same submit → claim → complete loop on `MemoryStore` (in process, no I/O), \
             {} s per row, on the harness's tokio runtime.",
            cfg.memory_secs
        ),
    );
    report.table(&["workers", "lifecycles/s", "operations/s"], rows);
    Ok(())
}
