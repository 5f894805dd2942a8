//! Where the test server is, and fixtures, pools and databases on it.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use taskfence::testing::PgFixture;

use crate::eventually;

/// The server: `DATABASE_URL`, or (machines with Docker) a throwaway
/// container started once per test binary with testcontainers.
pub async fn database_url() -> String {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return url;
    }
    container_url().await
}

async fn container_url() -> String {
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::ContainerAsync;
    use testcontainers_modules::testcontainers::runners::AsyncRunner;
    static CONTAINER: tokio::sync::OnceCell<(ContainerAsync<Postgres>, String)> =
        tokio::sync::OnceCell::const_new();
    let (_, url) = CONTAINER
        .get_or_init(|| async {
            let node = Postgres::default()
                .with_host_auth()
                .start()
                .await
                .expect("DATABASE_URL is unset and no Docker to start PostgreSQL in");
            let port = node.get_host_port_ipv4(5432).await.expect("mapped port");
            (node, format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        })
        .await;
    url.clone()
}

/// A fresh fixture (own schema) on the test server.
pub async fn fixture() -> PgFixture {
    PgFixture::connect(&database_url().await).await
}

/// A fresh fixture whose pool holds up to `connections` connections, so that
/// racers really run concurrently on the server.
pub async fn fixture_with(connections: u32) -> PgFixture {
    PgFixture::with_pool_options(
        &database_url().await,
        PgPoolOptions::new().max_connections(connections),
    )
    .await
}

/// One multi-thread runtime per test binary, for synchronous test bodies
/// (proptest) that run many async cases: the test kit's
/// ([`taskfence::testing::runtime`]), so the model suite's cases share it.
pub fn shared_runtime() -> &'static tokio::runtime::Runtime {
    taskfence::testing::runtime()
}

/// A fresh fixture (own schema) on one pool per test binary, made at first
/// use on the running runtime: a case of a property test (on
/// [`shared_runtime`]) then pays for its schema only.
pub async fn pooled_fixture() -> PgFixture {
    static POOL: tokio::sync::OnceCell<(String, PgPool)> = tokio::sync::OnceCell::const_new();
    let (url, pool) = POOL
        .get_or_init(|| async {
            let url = database_url().await;
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .test_before_acquire(false)
                .connect(&url)
                .await
                .expect("connect to the test server");
            (url, pool)
        })
        .await;
    PgFixture::on_pool(url, pool.clone()).await
}

/// The server's URL and one pool on [`shared_runtime`], made at first use:
/// a case then pays for its schema only. Call it outside `block_on`.
pub fn shared_pool(max_connections: u32) -> &'static (String, PgPool) {
    static POOL: std::sync::OnceLock<(String, PgPool)> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        shared_runtime().block_on(async {
            let url = database_url().await;
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                .test_before_acquire(false)
                .connect(&url)
                .await
                .expect("connect to the test server");
            (url, pool)
        })
    })
}

/// Waits until a statement of the fixture's schema containing `marker` is
/// blocked on a lock (seen in `pg_stat_activity`), for at most 10 s.
pub async fn wait_until_blocked(f: &PgFixture, marker: &str) {
    let pool = f.pg_store().pool().clone();
    let schema = format!("\"{}\"", f.schema());
    let marker = marker.to_owned();
    eventually(Duration::from_secs(10), || {
        let (pool, schema, marker) = (pool.clone(), schema.clone(), marker.clone());
        async move {
            let waiting: i64 = sqlx::query(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND strpos(query, $2) > 0",
            )
            .bind(&schema)
            .bind(&marker)
            .fetch_one(&pool)
            .await
            .expect("read pg_stat_activity")
            .get(0);
            (waiting > 0).then_some(())
        }
    })
    .await;
}

/// A database of its own on the test server (for tests that need the
/// `public` schema, like a host application's migrations, or a system whose
/// schema name is fixed), dropped on drop.
pub struct TempDatabase {
    admin: PgConnectOptions,
    name: String,
}

impl TempDatabase {
    /// Creates `taskfence_db_<unique>` on the test server.
    pub async fn create() -> Self {
        Self::create_at(&database_url().await).await
    }

    /// Creates `taskfence_db_<unique>` on the server of `url` (its database
    /// is where the `CREATE DATABASE` and the final `DROP` run).
    pub async fn create_at(url: &str) -> Self {
        use sqlx::{ConnectOptions, Connection};
        let admin: PgConnectOptions = url.parse().expect("valid URL");
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let name = format!("taskfence_db_{}", &unique[unique.len() - 16..]);
        let mut conn = admin.connect().await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create database");
        conn.close().await.ok();
        Self { admin, name }
    }

    /// The new database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connect options for the new database.
    pub fn options(&self) -> PgConnectOptions {
        self.admin.clone().database(&self.name)
    }

    /// The new database's URL, for a process the test starts.
    pub fn url(&self) -> String {
        use sqlx::ConnectOptions;
        self.options().to_url_lossy().to_string()
    }

    /// A pool on the new database.
    pub async fn pool(&self, connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .test_before_acquire(false)
            .connect_with(self.options())
            .await
            .expect("connect to the temporary database")
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            use sqlx::{ConnectOptions, Connection};
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = admin.connect().await.ok()?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await
                .ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}

/// Rows in `schema.table` (both quoted as identifiers): to check that refused
/// input wrote nothing, or that a run left exactly the rows it should.
pub async fn row_count(pool: &PgPool, schema: &str, table: &str) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\".\"{table}\""
    )))
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("count rows of {schema}.{table}: {e}"))
    .get(0)
}
