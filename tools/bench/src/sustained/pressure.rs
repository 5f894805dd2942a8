//! The pressure a phase puts on the server besides its load, each started in
//! the system's database and stopped when the phase ends: a transaction
//! holding a transaction id (the xmin horizon pinned, so vacuum can reclaim
//! nothing), four `REPEATABLE READ` readers scanning every table, the
//! system's connections terminated every second, a server restart.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use taskfence_test_support::PrivateServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Res;

/// The `application_name` of the harness's own connections, which the
/// terminator spares.
pub(crate) const HARNESS: &str = "bench-harness";

/// What a phase does to the server besides its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pressure {
    None,
    /// `BEGIN; SELECT txid_current();` held idle for the phase.
    HeldXmin,
    /// Four sessions, each scanning every table of the system in one
    /// `REPEATABLE READ` transaction after another.
    Readers,
    /// `pg_terminate_backend` on every client connection of the system's
    /// database (the harness's own excepted; never autovacuum's workers),
    /// every second.
    Terminations,
    /// An immediate-mode restart of the server (a crash and WAL replay)
    /// halfway through the phase.
    Restart,
}

/// Pressure being applied; [`Applied::end`] stops it.
pub(crate) struct Applied {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Res<()>>>,
}

impl Applied {
    /// Starts `pressure` on the database of `options` for a phase of `secs`.
    pub(crate) async fn start(
        pressure: Pressure,
        options: &PgConnectOptions,
        server: &Arc<PrivateServer>,
        secs: f64,
    ) -> Res<Self> {
        let (stop, stopped) = watch::channel(false);
        let options = options.clone().application_name(HARNESS);
        let mut tasks = Vec::new();
        match pressure {
            Pressure::None => {}
            Pressure::HeldXmin => {
                let mut conn = options.connect().await?;
                sqlx::raw_sql("BEGIN; SELECT txid_current();")
                    .execute(&mut conn)
                    .await?;
                let mut stopped = stopped.clone();
                tasks.push(tokio::spawn(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                    sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
                    conn.close().await?;
                    Ok(())
                }));
            }
            Pressure::Readers => {
                for _ in 0..4 {
                    let (options, stopped) = (options.clone(), stopped.clone());
                    tasks.push(tokio::spawn(read_until(options, stopped)));
                }
            }
            Pressure::Terminations => {
                let mut conn = options.connect().await?;
                let mut stopped = stopped.clone();
                tasks.push(tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            _ = stopped.wait_for(|s| *s) => break,
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                        sqlx::query(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE datname = current_database() AND pid <> pg_backend_pid() \
                               AND backend_type = 'client backend' AND application_name <> $1",
                        )
                        .bind(HARNESS)
                        .execute(&mut conn)
                        .await?;
                    }
                    conn.close().await?;
                    Ok(())
                }));
            }
            Pressure::Restart => {
                let (server, mut stopped) = (server.clone(), stopped.clone());
                tasks.push(tokio::spawn(async move {
                    tokio::select! {
                        _ = stopped.wait_for(|s| *s) => return Ok(()),
                        () = tokio::time::sleep(Duration::from_secs_f64(secs / 2.0)) => {}
                    }
                    tokio::task::spawn_blocking(move || server.restart()).await?;
                    Ok(())
                }));
            }
        }
        Ok(Self { stop, tasks })
    }

    /// Stops the pressure (the held transaction commits, the readers end).
    pub(crate) async fn end(self) -> Res<()> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// One reader: every table of the database counted in one `REPEATABLE READ`
/// transaction (its snapshot held for the whole scan), again and again.
async fn read_until(options: PgConnectOptions, stopped: watch::Receiver<bool>) -> Res<()> {
    let mut conn = options.connect().await?;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables ORDER BY 1")
            .fetch_all(&mut conn)
            .await?;
    while !*stopped.borrow() {
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut conn)
            .await?;
        for table in &tables {
            sqlx::query(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .execute(&mut conn)
                .await?;
        }
        sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(())
}
