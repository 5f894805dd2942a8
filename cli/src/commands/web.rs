//! `web`: the operator's dashboard (`taskfence-web`) on PostgreSQL or
//! DynamoDB, served until SIGINT or SIGTERM.
//!
//! It connects like every other command, then serves; read-only unless an
//! action token is given (`TASKFENCE_WEB_TOKEN`, so it stays out of `ps`).
//! The redispatch action writes new handoffs to the store's outbox (rows on
//! PostgreSQL, items on DynamoDB) for its dispatcher to publish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use taskfence_web::Dashboard;

use crate::backend::{Backend, Store, Target};
use crate::cli::parse_duration;
use crate::error::CliError;

/// `taskfence web`.
#[derive(Debug, Args)]
pub(crate) struct WebArgs {
    /// Address to serve on (a loopback address unless it sits behind your own proxy and authentication).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Enables reopen, cancel and redispatch for whoever signs in with it (at least 16 characters).
    #[arg(
        long,
        env = "TASKFENCE_WEB_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub action_token: Option<String>,
    /// Pending tasks unclaimed this long after their handoff count as stranded.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub stranded_after: Duration,
    /// How often the overview reloads itself.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub refresh: Duration,
}

/// Connects to `target` and serves the dashboard on `--listen` until SIGINT or SIGTERM.
pub(crate) async fn run(args: WebArgs, target: &Target) -> Result<(), CliError> {
    if let Some(token) = &args.action_token {
        taskfence_web::dashboard::check_action_token(token)
            .map_err(|e| CliError::Usage(format!("--action-token / TASKFENCE_WEB_TOKEN: {e}")))?;
    }
    let store = Store::connect(target, false).await?;
    let mut dashboard = Dashboard::new(store.inspect.clone())
        .stranded_after(args.stranded_after)
        .refresh_every(args.refresh);
    dashboard = match &store.backend {
        Backend::Postgres(pg) => dashboard.redispatch(Arc::clone(pg) as Arc<dyn taskfence_web::Redispatch>),
        Backend::DynamoDb(dynamo) => {
            dashboard.redispatch(Arc::clone(dynamo) as Arc<dyn taskfence_web::Redispatch>)
        }
    };
    let actions = args.action_token.is_some();
    if let Some(token) = args.action_token {
        dashboard = dashboard
            .action_token(token)
            .map_err(|e| CliError::Usage(format!("--action-token / TASKFENCE_WEB_TOKEN: {e}")))?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Operational(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr().unwrap_or(args.listen);
    let what = match target {
        Target::Postgres { schema, .. } => format!("PostgreSQL schema {schema}"),
        Target::DynamoDb { table, .. } => format!("DynamoDB table {table}"),
    };
    let mode = if actions { "actions enabled" } else { "read-only" };
    eprintln!("taskfence: serving the dashboard of {what} on http://{addr}/ ({mode}); Ctrl-C stops it");
    axum::serve(listener, dashboard.router::<()>())
        .with_graceful_shutdown(stop_signal())
        .await
        .map_err(|e| CliError::Operational(format!("the web server failed: {e}")))?;
    eprintln!("taskfence: dashboard stopped");
    Ok(())
}

/// SIGINT (Ctrl-C) or SIGTERM (a process manager).
async fn stop_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
