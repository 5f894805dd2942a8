//! `web`: the operator's dashboard (`taskfence-web`) on PostgreSQL or
//! DynamoDB, served until SIGINT or SIGTERM.
//!
//! It connects like every other command, then serves; read-only unless an
//! action token is given (`TASKFENCE_WEB_TOKEN` or `--action-token-file`,
//! so it stays out of `ps`; `--action-token` works with a warning). Task
//! data is shown to signed-in operators only unless `--open-reads`.
//! The redispatch action writes new handoffs to the store's outbox (rows on
//! PostgreSQL, items on DynamoDB) for its dispatcher to publish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use taskfence_web::Dashboard;

use crate::backend::{Concrete, Store, Target};
use crate::cli::parse_duration;
use crate::error::CliError;
use crate::secrets;

/// `taskfence web`.
#[derive(Debug, Args)]
pub(crate) struct WebArgs {
    /// Address to serve on (a loopback address unless it sits behind your own proxy and authentication).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Enables reopen, cancel and redispatch, and shows task data, for whoever signs in with it (at
    /// least 16 characters, 8 distinct, about 64 bits: draw it at random). On the command line it
    /// shows in `ps`: prefer TASKFENCE_WEB_TOKEN or --action-token-file.
    #[arg(
        long,
        env = "TASKFENCE_WEB_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub action_token: Option<String>,
    /// A file holding the action token (a trailing newline is ignored).
    #[arg(long, env = "TASKFENCE_WEB_TOKEN_FILE", value_name = "PATH")]
    pub action_token_file: Option<PathBuf>,
    /// Show task data (payloads, responses, request keys, errors) to everyone who reaches the
    /// dashboard, signed in or not: only behind your own authentication.
    #[arg(long)]
    pub open_reads: bool,
    /// Browsers reach the dashboard over HTTPS (through a TLS-terminating proxy): the session
    /// cookie is then Secure and named __Host-taskfence_session.
    #[arg(long)]
    pub served_over_tls: bool,
    /// How long a sign-in lasts.
    #[arg(long, default_value = "8h", value_parser = parse_duration, value_name = "DURATION")]
    pub session_lifetime: Duration,
    /// Pending tasks unclaimed this long after their handoff count as stranded.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub stranded_after: Duration,
    /// How often the overview reloads itself.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub refresh: Duration,
}

/// Connects to `target` and serves the dashboard on `--listen` until SIGINT
/// or SIGTERM. `token_typed`: the token came from the command line.
pub(crate) async fn run(mut args: WebArgs, token_typed: bool, target: &Target) -> Result<(), CliError> {
    const TOKEN_FLAGS: &str = "--action-token / TASKFENCE_WEB_TOKEN / --action-token-file";
    if let Some(path) = &args.action_token_file {
        if args.action_token.is_some() {
            return Err(CliError::Usage(
                "--action-token (or TASKFENCE_WEB_TOKEN) and --action-token-file: give one of them".into(),
            ));
        }
        args.action_token = Some(secrets::read_file("--action-token-file", path)?);
    } else if token_typed {
        secrets::warn(
            "--action-token on the command line is visible to other users in `ps`: \
             use TASKFENCE_WEB_TOKEN or --action-token-file",
        );
    }
    if let Some(token) = &args.action_token {
        taskfence_web::dashboard::check_action_token(token)
            .map_err(|e| CliError::Usage(format!("{TOKEN_FLAGS}: {e}")))?;
    }
    secrets::warn_unless_loopback(args.listen);
    let store = Store::connect(target, false).await?;
    let mut dashboard = Dashboard::new(store.inspect.clone())
        .stranded_after(args.stranded_after)
        .refresh_every(args.refresh)
        .session_lifetime(args.session_lifetime)
        .served_over_tls(args.served_over_tls);
    if args.open_reads {
        dashboard = dashboard.open_reads();
    }
    dashboard = match &store.concrete {
        Concrete::Postgres(pg) => dashboard.redispatch(Arc::clone(pg) as Arc<dyn taskfence_web::Redispatch>),
        Concrete::Sqlite(sqlite) => {
            dashboard.redispatch(Arc::clone(sqlite) as Arc<dyn taskfence_web::Redispatch>)
        }
        Concrete::DynamoDb(dynamo) => {
            dashboard.redispatch(Arc::clone(dynamo) as Arc<dyn taskfence_web::Redispatch>)
        }
    };
    let actions = args.action_token.is_some();
    if let Some(token) = args.action_token {
        dashboard = dashboard
            .action_token(token)
            .map_err(|e| CliError::Usage(format!("{TOKEN_FLAGS}: {e}")))?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Operational(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener.local_addr().unwrap_or(args.listen);
    let what = match target {
        Target::Postgres { schema, .. } => format!("PostgreSQL schema {schema}"),
        Target::Sqlite { path } => format!("SQLite file {}", path.display()),
        Target::DynamoDb { table, .. } => format!("DynamoDB table {table}"),
    };
    let mode = match (actions, args.open_reads) {
        (true, false) => "actions and task data for signed-in operators",
        (true, true) => "actions for signed-in operators, task data for everyone",
        (false, false) => "read-only, task data hidden",
        (false, true) => "read-only, task data for everyone",
    };
    eprintln!("taskfence: serving the dashboard of {what} on http://{addr}/ ({mode}); Ctrl-C stops it");
    // With each connection's address: the sign-in throttle counts wrong tokens per client.
    let app = dashboard
        .router::<()>()
        .into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
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
