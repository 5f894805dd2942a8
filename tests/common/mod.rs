//! Shared helpers of the PostgreSQL tests: where the server is, fixtures, and
//! a wire-protocol proxy that counts the statements a client really sends and
//! can lose a reply on purpose.
#![allow(dead_code)] // each test binary uses a part

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use taskfence::testing::PgFixture;
use taskfence::{InputHash, NewTask, PgStore, RequestKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
/// (proptest) that run many async cases.
pub fn shared_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
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

/// A submission under user-1's `chat.reply` key `key`, its inputs bound to the key.
pub fn new_task(key: &str) -> NewTask {
    NewTask::new(
        RequestKey::new("user-1", "chat.reply", key),
        InputHash::of(["m", key]),
    )
}

/// Polls `check` until it returns `Some`, for at most `within`.
pub async fn eventually<T, Fut>(within: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Frontend (client → server) message counts, by message type.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    /// Simple-protocol queries (`Q`): each may hold several statements.
    pub simple_queries: u64,
    /// Extended-protocol `Parse` messages (a statement prepared).
    pub parses: u64,
    /// Extended-protocol `Execute` messages: one per statement executed.
    pub executes: u64,
    /// Requests: a `Sync` ending a batch of extended-protocol messages, which
    /// the client then waits on (one round trip).
    pub requests: u64,
    /// Lone `Sync`s: sqlx's liveness check when a connection goes back to the
    /// pool, sent after the operation has returned (not a statement).
    pub pings: u64,
}

impl Wire {
    /// Statements executed: extended `Execute`s plus simple queries.
    pub fn statements(&self) -> u64 {
        self.executes + self.simple_queries
    }
    /// Round trips carrying statements: requests plus simple queries.
    pub fn round_trips(&self) -> u64 {
        self.requests + self.simple_queries
    }
}

/// A loopback TCP proxy in front of the server that parses the PostgreSQL
/// frontend protocol and counts messages: the statements a client sends,
/// counted on the wire rather than trusted from the client. It can also
/// swallow the reply to the next request and cut the connection (a lost
/// acknowledgement, after the server committed).
pub struct WireProxy {
    addr: std::net::SocketAddr,
    counts: Arc<Mutex<HashMap<u8, u64>>>,
    lose_next_reply: Arc<AtomicBool>,
    accept: JoinHandle<()>,
    upstream: PgConnectOptions,
}

impl WireProxy {
    /// Starts a proxy to the server at `url`.
    pub async fn start(url: &str) -> Self {
        let upstream: PgConnectOptions = url.parse().expect("valid URL");
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let lose_next_reply = Arc::new(AtomicBool::new(false));
        let (c, l) = (counts.clone(), lose_next_reply.clone());
        let accept = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                connections.push(tokio::spawn(pipe(client, server, c.clone(), l.clone())));
            }
            for conn in connections {
                conn.abort();
            }
        });
        Self {
            addr,
            counts,
            lose_next_reply,
            accept,
            upstream,
        }
    }

    /// Connect options that go through the proxy (TLS off, so the proxy can read the protocol).
    pub fn connect_options(&self) -> PgConnectOptions {
        self.upstream
            .clone()
            .host("127.0.0.1")
            .port(self.addr.port())
            .ssl_mode(PgSslMode::Disable)
    }

    /// A pool of `connections` through the proxy, without the acquire-time ping.
    pub async fn pool(&self, connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .min_connections(connections)
            .test_before_acquire(false)
            .connect_with(self.connect_options())
            .await
            .expect("connect through the proxy")
    }

    /// A [`PgStore`] on the fixture's schema whose traffic goes through the proxy.
    pub async fn store(&self, fixture: &PgFixture, connections: u32) -> PgStore {
        PgStore::builder(self.pool(connections).await)
            .schema(fixture.schema())
            .build()
            .expect("valid schema")
    }

    /// The counts since the last [`take`](Self::take), and resets them.
    pub fn take(&self) -> Wire {
        let mut counts = self.counts.lock().unwrap();
        let get = |t: u8| counts.get(&t).copied().unwrap_or(0);
        let wire = Wire {
            simple_queries: get(b'Q'),
            parses: get(b'P'),
            executes: get(b'E'),
            requests: get(REQUEST),
            pings: get(PING),
        };
        counts.clear();
        wire
    }

    /// The reply to the next request on any connection is swallowed (the
    /// server has executed and committed it: the proxy waits for its
    /// `ReadyForQuery`), then that connection is cut.
    pub fn lose_next_reply(&self) {
        self.lose_next_reply.store(true, Ordering::SeqCst);
    }
}

impl Drop for WireProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Synthetic count keys (not protocol message types).
const REQUEST: u8 = 1;
const PING: u8 = 2;

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    counts: Arc<Mutex<HashMap<u8, u64>>>,
    lose_next_reply: Arc<AtomicBool>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async move {
        let mut frames = Frames::startup();
        let mut buf = vec![0u8; 64 * 1024];
        let mut batch = false; // messages since the last Sync
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for kind in frames.push(&buf[..n]) {
                let mut counts = counts.lock().unwrap();
                *counts.entry(kind).or_default() += 1;
                if kind == b'S' {
                    *counts.entry(if batch { REQUEST } else { PING }).or_default() += 1;
                    batch = false;
                } else {
                    batch = true;
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async move {
        let mut frames = Frames::typed();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if lose_next_reply.load(Ordering::SeqCst) {
                // Swallow everything up to the server's ReadyForQuery: by then
                // the statement has committed. Then cut the client off.
                if frames.push(&buf[..n]).contains(&b'Z') {
                    lose_next_reply.store(false, Ordering::SeqCst);
                    let _ = client_write.shutdown().await;
                    break;
                }
                continue;
            }
            frames.push(&buf[..n]);
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    // When either side ends, the whole connection ends.
    tokio::select! {
        _ = upstream => {},
        _ = downstream => {},
    }
}

/// Incremental framing of PostgreSQL protocol messages: a type byte and a
/// big-endian length that counts itself (the first frontend message, the
/// startup packet, has no type byte).
struct Frames {
    pending: Vec<u8>,
    startup: bool,
}

impl Frames {
    fn startup() -> Self {
        Self {
            pending: Vec::new(),
            startup: true,
        }
    }

    fn typed() -> Self {
        Self {
            pending: Vec::new(),
            startup: false,
        }
    }

    /// Adds bytes; returns the types of the messages completed by them.
    fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut kinds = Vec::new();
        loop {
            if self.startup {
                let Some(len) = self
                    .pending
                    .get(..4)
                    .map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
                else {
                    break;
                };
                if self.pending.len() < len {
                    break;
                }
                self.pending.drain(..len);
                self.startup = false;
                continue;
            }
            let Some(len) = self
                .pending
                .get(1..5)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
            else {
                break;
            };
            if self.pending.len() < 1 + len {
                break;
            }
            kinds.push(self.pending[0]);
            self.pending.drain(..1 + len);
        }
        kinds
    }
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
/// `public` schema, like a host application's migrations), dropped on drop.
pub struct TempDatabase {
    admin: PgConnectOptions,
    name: String,
}

impl TempDatabase {
    /// Creates `taskfence_db_<unique>`.
    pub async fn create() -> Self {
        use sqlx::{ConnectOptions, Connection};
        let admin: PgConnectOptions = database_url().await.parse().expect("valid URL");
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let name = format!("taskfence_db_{}", &unique[unique.len() - 16..]);
        let mut conn = admin.connect().await.expect("connect");
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .expect("create database");
        conn.close().await.ok();
        Self { admin, name }
    }

    /// Connect options for the new database.
    pub fn options(&self) -> PgConnectOptions {
        self.admin.clone().database(&self.name)
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
                sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(&mut conn)
                    .await
                    .ok()?;
                conn.close().await.ok()
            })
        })
        .join();
    }
}
