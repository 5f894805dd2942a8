//! The store a service runs on, chosen by its settings (feature `stores`):
//! PostgreSQL ([`PgStore`](taskfence::PgStore)) or DynamoDB
//! ([`DynamoStore`]), each opened and checked at start-up and given the
//! [`Dispatcher`] of its own transactional outbox. With the `clap` feature
//! [`StoreConfig`] is a set of flags with environment variables.

use std::sync::Arc;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use taskfence::config::{ConnectError, connect_postgres};
use taskfence::{DynamoStore, TaskStore};

use crate::{Dispatcher, SqsQueue};

/// Where the tasks (and the outbox of handoffs) are stored.
///
/// ```
/// assert_ne!(taskfence_sqs::StoreKind::Postgres, taskfence_sqs::StoreKind::Dynamodb);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StoreKind {
    /// PostgreSQL (`PgStore`, `--database-url`), with its built-in outbox.
    Postgres,
    /// DynamoDB (`DynamoStore`, `--dynamodb-table`), with its outbox in the
    /// same table: an all-AWS stack.
    Dynamodb,
}

/// Which store a service opens, and how:
///
/// | field | flag / variable | default |
/// | --- | --- | --- |
/// | `store` | `--store` / `TASKFENCE_STORE` | `postgres` |
/// | `database_url` | `--database-url` / `DATABASE_URL` | required with `postgres` |
/// | `dynamodb_table` | `--dynamodb-table` / `TASKFENCE_DYNAMODB_TABLE` | required with `dynamodb` |
/// | `schema` | `--schema` / `TASKFENCE_SCHEMA` | `taskfence` |
/// | `db_max_connections` | `--db-max-connections` / `TASKFENCE_DB_MAX_CONNECTIONS` | 20 |
/// | `skip_migrations` | `--skip-migrations` / `TASKFENCE_SKIP_MIGRATIONS` | off |
///
/// ```
/// let config = taskfence_sqs::StoreConfig {
///     database_url: Some("postgres://db/app".into()),
///     ..Default::default()
/// };
/// assert_eq!((config.store, config.db_max_connections), (taskfence_sqs::StoreKind::Postgres, 20));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct StoreConfig {
    /// Where tasks are stored: PostgreSQL (needs --database-url) or DynamoDB
    /// (needs --dynamodb-table).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_STORE", value_enum, default_value_t = StoreKind::Postgres))]
    pub store: StoreKind,
    /// PostgreSQL URL (with --store postgres). For TLS add
    /// `?sslmode=require`, or `?sslmode=verify-full&sslrootcert=/path/ca.pem` (RDS).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "DATABASE_URL",
            hide_env_values = true,
            required_if_eq("store", "postgres")
        )
    )]
    pub database_url: Option<String>,
    /// The DynamoDB table of tasks and handoffs (with --store dynamodb). The
    /// service does not create it (see docs/DYNAMODB.md).
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_DYNAMODB_TABLE", required_if_eq("store", "dynamodb"))
    )]
    pub dynamodb_table: Option<String>,
    /// The schema holding taskfence's tables.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_SCHEMA", default_value = "taskfence")
    )]
    pub schema: String,
    /// Size of the PostgreSQL pool: cover the concurrency, the lease
    /// renewals and the dispatcher.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TASKFENCE_DB_MAX_CONNECTIONS", default_value_t = 20)
    )]
    pub db_max_connections: u32,
    /// Do not apply the embedded migrations at start-up (when a deploy step
    /// applies them instead).
    #[cfg_attr(feature = "clap", arg(long, env = "TASKFENCE_SKIP_MIGRATIONS"))]
    pub skip_migrations: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            store: StoreKind::Postgres,
            database_url: None,
            dynamodb_table: None,
            schema: "taskfence".into(),
            db_max_connections: 20,
            skip_migrations: false,
        }
    }
}

/// Why [`StoreConfig::open`] failed. Nothing was consumed or published.
///
/// ```
/// let error = taskfence_sqs::store::StoreError::Missing("--database-url");
/// assert_eq!(error.to_string(), "the chosen store needs --database-url");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The chosen store's URL or table is not set.
    #[error("the chosen store needs {0}")]
    Missing(&'static str),
    /// PostgreSQL could not be reached (or its URL or schema is invalid).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The DynamoDB table is missing, or the credentials may not describe it.
    #[error("DynamoDB table {table}: {message}")]
    Table {
        /// The table's name.
        table: String,
        /// The SDK's error with its context.
        message: String,
    },
    /// Migrating or opening the store failed.
    #[error(transparent)]
    Store(#[from] taskfence::Error),
}

/// A store [`StoreConfig::open`] opened, and the dispatcher of its outbox.
///
/// ```no_run
/// # fn f(opened: taskfence_sqs::store::Opened) {
/// let taskfence_sqs::store::Opened { store, outbox } = opened;
/// # }
/// ```
pub struct Opened {
    /// The store, as the worker takes it.
    pub store: Arc<dyn TaskStore>,
    /// Publishes the store's outbox to the queue (see
    /// [`DispatchConfig::start`](crate::DispatchConfig::start)).
    pub outbox: Dispatcher,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("outbox", &self.outbox)
            .finish_non_exhaustive()
    }
}

impl StoreConfig {
    /// Opens the chosen store: PostgreSQL through
    /// [`connect_postgres`] (sessions named `application_name`), migrated
    /// unless `skip_migrations` (idempotent, serialized by an advisory
    /// lock); or DynamoDB on the client `dynamodb` builds, its table checked
    /// with [`check_table`]. The outbox's dispatcher publishes to `queue`,
    /// `batch` handoffs a round.
    ///
    /// ```no_run
    /// # async fn f(aws: aws_config::SdkConfig, queue: taskfence_sqs::SqsQueue) -> Result<(), Box<dyn std::error::Error>> {
    /// let config = taskfence_sqs::StoreConfig::default();
    /// let dynamodb = || aws_sdk_dynamodb::Client::new(&aws);
    /// let opened = config.open("my-worker", dynamodb, &queue, 100).await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(
        &self,
        application_name: &str,
        dynamodb: impl FnOnce() -> aws_sdk_dynamodb::Client,
        queue: &SqsQueue,
        batch: usize,
    ) -> Result<Opened, StoreError> {
        match self.store {
            StoreKind::Postgres => {
                let url = self.database_url.as_deref();
                let url = url.ok_or(StoreError::Missing("--database-url"))?;
                let max = self.db_max_connections;
                let pg = connect_postgres(url, &self.schema, max, application_name).await?;
                if !self.skip_migrations {
                    pg.migrate().await?;
                }
                let outbox = Dispatcher::new(pg.clone(), queue.clone(), batch);
                Ok(Opened {
                    store: Arc::new(pg),
                    outbox,
                })
            }
            StoreKind::Dynamodb => {
                let table = self.dynamodb_table.as_deref();
                let table = table.ok_or(StoreError::Missing("--dynamodb-table"))?;
                let client = dynamodb();
                check_table(&client, table).await?;
                let store = DynamoStore::new(client, table)?;
                let outbox = Dispatcher::new(store.clone(), queue.clone(), batch);
                Ok(Opened {
                    store: Arc::new(store),
                    outbox,
                })
            }
        }
    }
}

/// Fails unless `table` exists and the credentials may describe it: at
/// start-up, so a wrong name, region or role stops the service at once.
///
/// ```no_run
/// # async fn f(client: aws_sdk_dynamodb::Client) -> Result<(), taskfence_sqs::store::StoreError> {
/// taskfence_sqs::store::check_table(&client, "taskfence").await?;
/// # Ok(()) }
/// ```
pub async fn check_table(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<(), StoreError> {
    client
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| StoreError::Table {
            table: table.to_owned(),
            message: DisplayErrorContext(e).to_string(),
        })?;
    Ok(())
}
