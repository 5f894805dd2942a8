//! A PostgreSQL wire proxy: counts the statements and round trips a client
//! really sends (counted on the wire, not trusted from the client; the server
//! here has no `pg_stat_statements`), and can lose a reply on purpose.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use taskfence::PgStore;
use taskfence::testing::PgFixture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
        Self::start_with(url.parse().expect("valid URL")).await
    }

    /// Starts a proxy to the server `upstream` names (its user, database and
    /// session settings are kept in [`connect_options`](Self::connect_options)).
    pub async fn start_with(upstream: PgConnectOptions) -> Self {
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
                if kind == b'Q' {
                    // A simple query is its own round trip: a `Sync` right
                    // after it (a release ping) ends no batch.
                    batch = false;
                } else if kind == b'S' {
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
    /// The client's side: a startup packet first.
    fn startup() -> Self {
        Self {
            pending: Vec::new(),
            startup: true,
        }
    }

    /// The server's side: typed messages only.
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
        let mut at = 0; // start of the first incomplete message
        loop {
            let type_len = usize::from(!self.startup);
            let Some(len) = self
                .pending
                .get(at + type_len..at + type_len + 4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
            else {
                break;
            };
            if self.pending.len() < at + type_len + len {
                break;
            }
            if !self.startup {
                kinds.push(self.pending[at]);
            }
            self.startup = false;
            at += type_len + len;
        }
        // Once per read, not once per message.
        self.pending.drain(..at);
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::Frames;

    /// A message of type `kind` with a `body`: type byte, length, body.
    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn messages_split_across_reads_are_counted_once_complete() {
        let mut bytes = 8u32.to_be_bytes().to_vec(); // startup packet: no type byte
        bytes.extend_from_slice(&[0, 3, 0, 0]);
        bytes.extend(message(b'P', b"SELECT 1\0"));
        bytes.extend(message(b'E', b""));
        bytes.extend(message(b'S', b""));
        let mut frames = Frames::startup();
        let mut kinds = Vec::new();
        for chunk in bytes.chunks(3) {
            kinds.extend(frames.push(chunk));
        }
        assert_eq!(kinds, b"PES");
        assert!(frames.pending.is_empty());
        assert_eq!(Frames::typed().push(&message(b'Z', b"I")), b"Z");
    }
}
