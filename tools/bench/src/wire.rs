//! Round trips counted on the wire: a loopback proxy in front of the server
//! that parses the PostgreSQL frontend protocol (the server here has no
//! `pg_stat_statements`, and counting on the wire does not trust the client).
//!
//! The same framing as the proxy in the library's `tests/common` (which can
//! also lose replies on purpose); this one only counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Frontend message counts since the last [`WireCounter::take`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wire {
    /// Simple-protocol queries (`Q`, e.g. sqlx's `BEGIN` / `COMMIT`).
    pub simple_queries: u64,
    /// Extended-protocol `Execute`s: one per statement executed.
    pub executes: u64,
    /// A `Sync` ending a batch of messages: the client waits on it (one round trip).
    pub requests: u64,
    /// A lone `Sync`: sqlx's liveness check when a connection goes back to
    /// the pool, sent after the operation returned.
    pub pings: u64,
}

impl Wire {
    /// Statements executed.
    pub fn statements(&self) -> u64 {
        self.executes + self.simple_queries
    }

    /// Round trips carrying statements (pings excluded).
    pub fn round_trips(&self) -> u64 {
        self.requests + self.simple_queries
    }
}

const REQUEST: u8 = 1;
const PING: u8 = 2;

/// The counting proxy; stops accepting when dropped.
pub struct WireCounter {
    port: u16,
    upstream: PgConnectOptions,
    counts: Arc<Mutex<HashMap<u8, u64>>>,
    accept: JoinHandle<()>,
}

impl WireCounter {
    pub async fn start(upstream: PgConnectOptions) -> std::io::Result<Self> {
        let target = format!("{}:{}", upstream.get_host(), upstream.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let c = counts.clone();
        let accept = tokio::spawn(async move {
            let mut pipes = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                if let Ok(server) = TcpStream::connect(&target).await {
                    pipes.push(tokio::spawn(pipe(client, server, c.clone())));
                }
            }
            for p in pipes {
                p.abort();
            }
        });
        Ok(Self {
            port,
            upstream,
            counts,
            accept,
        })
    }

    /// A one-connection pool through the proxy (TLS off so it can read the
    /// protocol; no acquire-time ping, as for the benchmarked pools).
    pub async fn pool(&self) -> Result<PgPool, sqlx::Error> {
        let options = self
            .upstream
            .clone()
            .host("127.0.0.1")
            .port(self.port)
            .ssl_mode(PgSslMode::Disable);
        PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options)
            .await
    }

    /// The counts since the last call, reset.
    pub fn take(&self) -> Wire {
        let mut counts = self.counts.lock().expect("counts lock");
        let get = |t: u8| counts.get(&t).copied().unwrap_or(0);
        let wire = Wire {
            simple_queries: get(b'Q'),
            executes: get(b'E'),
            requests: get(REQUEST),
            pings: get(PING),
        };
        counts.clear();
        wire
    }
}

impl Drop for WireCounter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, counts: Arc<Mutex<HashMap<u8, u64>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async move {
        let mut frames = Frames {
            pending: Vec::new(),
            startup: true,
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut batch = false;
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for kind in frames.push(&buf[..n]) {
                let mut counts = counts.lock().expect("counts lock");
                *counts.entry(kind).or_default() += 1;
                if kind == b'Q' {
                    // A simple query is its own round trip.
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
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    };
    tokio::select! {
        _ = upstream => {},
        _ = downstream => {},
    }
}

/// Incremental framing: a type byte and a big-endian length that counts
/// itself (the startup packet has no type byte).
struct Frames {
    pending: Vec<u8>,
    startup: bool,
}

impl Frames {
    fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut kinds = Vec::new();
        loop {
            let (header, skip_type) = if self.startup { (0..4, 0) } else { (1..5, 1) };
            let Some(len) = self
                .pending
                .get(header)
                .map(|b| u32::from_be_bytes(b.try_into().expect("four bytes")) as usize)
            else {
                break;
            };
            if self.pending.len() < skip_type + len {
                break;
            }
            if self.startup {
                self.startup = false;
            } else {
                kinds.push(self.pending[0]);
            }
            self.pending.drain(..skip_type + len);
        }
        kinds
    }
}
