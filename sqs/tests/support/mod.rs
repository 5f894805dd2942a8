//! moto's SQS for the tests: `TASKFENCE_SQS_ENDPOINT` when set (the
//! project's test script starts moto once), otherwise a `moto_server` the
//! test starts on a free loopback port; and a client on it.

use std::process::{Command, Stdio};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{Credentials, Region};
use taskfence_sqs::SqsQueue;
use taskfence_test_support::{ChildProcess, free_port};

pub(crate) struct Moto {
    pub(crate) endpoint: String,
    _server: Option<ChildProcess>,
}

impl Moto {
    pub(crate) fn start_or_env() -> Self {
        if let Ok(endpoint) = std::env::var("TASKFENCE_SQS_ENDPOINT") {
            return Self {
                endpoint,
                _server: None,
            };
        }
        let port = free_port();
        let mut command = Command::new("moto_server");
        command
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Panics with the command when moto is missing: install it with
        // `python3 -m pip install 'moto[server]'` or run ./scripts/test.
        let mut server = ChildProcess::spawn("moto_server", &mut command);
        if let Err(status) = server.wait_listening(port, Duration::from_secs(30)) {
            panic!("moto_server exited ({status}) before listening on port {port}");
        }
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            _server: Some(server),
        }
    }
}

/// An SQS client on `endpoint` with a fixed region and dummy credentials.
pub(crate) async fn client(endpoint: &str) -> Client {
    use aws_smithy_http_client::{Builder, tls};
    let http = Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "taskfence-sqs-tests",
        ))
        .http_client(http)
        .load()
        .await;
    Client::new(&config)
}

/// A fresh queue with a unique name on `moto`.
pub(crate) async fn queue(moto: &Moto, prefix: &str) -> SqsQueue {
    let name = format!("{prefix}-{}", uuid::Uuid::now_v7().simple());
    SqsQueue::create(client(&moto.endpoint).await, &name, Duration::from_secs(2))
        .await
        .expect("create a queue on moto")
}
