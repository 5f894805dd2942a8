//! Which store to talk to, and connecting to it.
//!
//! Both backends end up behind one `Arc<dyn Inspect>` so every command is
//! written once; the concrete store is kept beside it for the two things
//! only one backend has (PostgreSQL's migrations and redispatch, DynamoDB's
//! table creation).
//!
//! Connecting checks what it can before a command runs, so a wrong URL,
//! password, schema name, region or table fails at once with one line,
//! instead of a pool's retries until a timeout.

use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection};
use taskfence::inspect::Inspect;
use taskfence::{DynamoStore, PgStore, SqliteStore};
use time::OffsetDateTime;

use crate::cli::StoreArgs;
use crate::error::{CliError, chain};

/// How long connecting may take before the tool gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The store named on the command line, not yet connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// PostgreSQL at `url`, tables in `schema`.
    Postgres {
        /// The connection URL.
        url: String,
        /// The schema.
        schema: String,
    },
    /// The SQLite file at `path`.
    Sqlite {
        /// The database file.
        path: std::path::PathBuf,
    },
    /// DynamoDB `table`, on `endpoint` or AWS's.
    DynamoDb {
        /// The table.
        table: String,
        /// A local endpoint (moto, DynamoDB Local).
        endpoint: Option<String>,
    },
}

/// Whether each store flag was typed on the command line (rather than read
/// from the environment): a typed flag wins over the other's variable.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Typed {
    /// `--database-url` was typed.
    pub database_url: bool,
    /// `--dynamodb-table` was typed.
    pub dynamodb_table: bool,
    /// `--sqlite` was typed.
    pub sqlite: bool,
}

impl Target {
    /// Picks the backend: the one given; when several are, the one typed on
    /// the command line (`DATABASE_URL` is often set for an application, and
    /// `--dynamodb-table` or `--sqlite` then still works); several typed or
    /// none given is a usage error.
    pub(crate) fn choose(args: &StoreArgs, typed: Typed) -> Result<Self, CliError> {
        let given: Vec<(bool, Target)> = [
            args.database_url.as_ref().map(|url| {
                (
                    typed.database_url,
                    Target::Postgres {
                        url: url.clone(),
                        schema: args.schema.clone(),
                    },
                )
            }),
            args.sqlite
                .as_ref()
                .map(|path| (typed.sqlite, Target::Sqlite { path: path.clone() })),
            args.dynamodb_table.as_ref().map(|table| {
                (
                    typed.dynamodb_table,
                    Target::DynamoDb {
                        table: table.clone(),
                        endpoint: args.dynamodb_endpoint.clone(),
                    },
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        const FLAGS: &str = "--database-url / DATABASE_URL, --sqlite / TASKFENCE_SQLITE or --dynamodb-table / TASKFENCE_DYNAMODB_TABLE";
        if given.is_empty() {
            return Err(CliError::Usage(format!("no store: give one of {FLAGS}")));
        }
        if given.len() == 1 {
            return Ok(given.into_iter().next().map(|(_, t)| t).expect("one"));
        }
        let mut typed: Vec<Target> = given.into_iter().filter(|(t, _)| *t).map(|(_, t)| t).collect();
        if typed.len() == 1 {
            return Ok(typed.remove(0));
        }
        Err(CliError::Usage(format!(
            "several stores are given: choose one ({FLAGS})"
        )))
    }
}

/// The concrete store, for what only one backend has.
#[derive(Clone)]
pub(crate) enum Concrete {
    /// PostgreSQL.
    Postgres(Arc<PgStore>),
    /// SQLite.
    Sqlite(Arc<SqliteStore>),
    /// DynamoDB.
    DynamoDb(Arc<DynamoStore>),
}

/// A connected store.
#[derive(Clone)]
pub(crate) struct Store {
    /// Every command's view of it.
    pub inspect: Arc<dyn Inspect>,
    /// The same store, concretely.
    pub concrete: Concrete,
}

impl Store {
    /// The store's clock, which stamps every task: ages and `--older-than`
    /// are measured on it, so a skewed laptop clock changes nothing.
    /// PostgreSQL: the schema's `store_clock()`; DynamoDB: this machine's
    /// clock, which is what a DynamoDB writer stamps with too.
    pub(crate) async fn now(&self) -> Result<OffsetDateTime, CliError> {
        match &self.concrete {
            Concrete::Postgres(pg) => {
                let sql = format!("SELECT \"{}\".store_clock()", pg.schema());
                sqlx::query_scalar::<_, OffsetDateTime>(sqlx::AssertSqlSafe(sql.as_str()))
                    .fetch_one(pg.pool())
                    .await
                    .map_err(|e| CliError::from(taskfence::Error::storage(e)))
            }
            // The machine's clock: the one a SQLite store reads (same machine, same file).
            Concrete::Sqlite(_) | Concrete::DynamoDb(_) => Ok(OffsetDateTime::now_utc()),
        }
    }

    /// Connects to `target`. With `table_may_be_missing` (the `migrate`
    /// command), a missing DynamoDB table is not an error.
    pub(crate) async fn connect(target: &Target, table_may_be_missing: bool) -> Result<Self, CliError> {
        match target {
            Target::Postgres { url, schema } => postgres(url, schema).await,
            Target::Sqlite { path } => sqlite(path, table_may_be_missing).await,
            Target::DynamoDb { table, endpoint } => {
                dynamodb(table, endpoint.as_deref(), table_may_be_missing).await
            }
        }
    }
}

async fn postgres(url: &str, schema: &str) -> Result<Store, CliError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(CliError::Usage(
            "--database-url is not a PostgreSQL URL: expected postgres://user:password@host:5432/database"
                .into(),
        ));
    }
    let options: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
        CliError::Usage(format!("--database-url is not a PostgreSQL URL: {}", chain(&e)))
    })?;
    let options = options
        .application_name("taskfence-cli")
        .disable_statement_logging();
    // The pool connects lazily: building the store first checks the schema
    // name without touching the network.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options.clone());
    let store = Arc::new(PgStore::builder(pool).schema(schema).build()?);
    // One plain connection: a refused port or a wrong password fails here
    // with the server's words (the pool would retry until its timeout).
    let server = format!("{}:{}", options.get_host(), options.get_port());
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .map_err(|_| {
            CliError::Operational(format!(
                "cannot connect to PostgreSQL at {server}: no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| {
            CliError::Operational(format!("cannot connect to PostgreSQL at {server}: {}", chain(&e)))
        })?;
    conn.close().await.ok();
    Ok(Store {
        inspect: store.clone(),
        concrete: Concrete::Postgres(store),
    })
}

/// The SQLite file at `path`; it must exist unless `may_be_missing` (the
/// `migrate` command creates it), so a mistyped path is not a new empty store.
async fn sqlite(path: &std::path::Path, may_be_missing: bool) -> Result<Store, CliError> {
    if !may_be_missing && !path.exists() {
        return Err(CliError::Operational(format!(
            "SQLite file {} does not exist (create it with `taskfence migrate`)",
            path.display()
        )));
    }
    let store = SqliteStore::builder(path)
        .max_connections(2)
        .open()
        .await
        .map_err(|e| CliError::Operational(format!("cannot open SQLite file {}: {e}", path.display())))?;
    let store = Arc::new(store);
    Ok(Store {
        inspect: store.clone(),
        concrete: Concrete::Sqlite(store),
    })
}

async fn dynamodb(
    table: &str,
    endpoint: Option<&str>,
    table_may_be_missing: bool,
) -> Result<Store, CliError> {
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await;
    if sdk.region().is_none() {
        return Err(CliError::Usage(
            "no AWS region: set AWS_REGION (or the profile's region)".into(),
        ));
    }
    let mut config = aws_sdk_dynamodb::config::Builder::from(&sdk);
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let store = Arc::new(DynamoStore::new(client.clone(), table)?);
    if !table_may_be_missing && !table_exists(&client, table).await? {
        return Err(CliError::Operational(format!(
            "DynamoDB table {table} does not exist (create it with `taskfence migrate`)"
        )));
    }
    Ok(Store {
        inspect: store.clone(),
        concrete: Concrete::DynamoDb(store),
    })
}

/// Whether `table` exists (`DescribeTable`); other failures (credentials,
/// endpoint) are operational errors.
pub(crate) async fn table_exists(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<bool, CliError> {
    match client.describe_table().table_name(table).send().await {
        Ok(_) => Ok(true),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            Ok(false)
        }
        Err(e) => Err(CliError::Operational(format!(
            "DynamoDB table {table}: {}",
            chain(&e)
        ))),
    }
}

/// hyper with rustls on ring; also plain HTTP for local endpoints.
fn http_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::{Builder, tls};
    Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: Option<&str>, table: Option<&str>) -> StoreArgs {
        StoreArgs {
            database_url: url.map(Into::into),
            database_url_file: None,
            schema: "taskfence".into(),
            dynamodb_table: table.map(Into::into),
            dynamodb_endpoint: None,
            sqlite: None,
        }
    }

    #[test]
    fn the_typed_flag_wins() {
        let both = args(Some("postgres://x"), Some("t"));
        let typed_table = Typed {
            dynamodb_table: true,
            ..Typed::default()
        };
        assert!(matches!(
            Target::choose(&both, typed_table),
            Ok(Target::DynamoDb { .. })
        ));
        assert!(matches!(
            Target::choose(&both, Typed::default()),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            Target::choose(&args(None, None), Typed::default()),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            Target::choose(&args(Some("postgres://x"), None), Typed::default()),
            Ok(Target::Postgres { .. })
        ));
        let sqlite_and_url = StoreArgs {
            sqlite: Some("tasks.db".into()),
            ..args(Some("postgres://x"), None)
        };
        let typed_sqlite = Typed {
            sqlite: true,
            ..Typed::default()
        };
        assert!(matches!(
            Target::choose(&sqlite_and_url, typed_sqlite),
            Ok(Target::Sqlite { .. })
        ));
        assert!(matches!(
            Target::choose(&sqlite_and_url, Typed::default()),
            Err(CliError::Usage(_))
        ));
    }
}
