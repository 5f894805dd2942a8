//! Shared helpers of the end-to-end tests: a moto SQS server on loopback.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The SQS endpoint for a test: `TASKFENCE_SQS_ENDPOINT` when set (the
/// project's test script starts moto once), otherwise a `moto_server` this
/// test starts on a free loopback port and stops when dropped.
pub struct Moto {
    pub endpoint: String,
    child: Option<Child>,
}

impl Moto {
    pub fn start_or_env() -> Self {
        if let Ok(endpoint) = std::env::var("TASKFENCE_SQS_ENDPOINT") {
            return Self {
                endpoint,
                child: None,
            };
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "TASKFENCE_SQS_ENDPOINT is unset and `moto_server` could not be started ({e}); \
                     install it with `python3 -m pip install 'moto[server]'` or run ./scripts/test"
                )
            });
        let moto = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on port {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
