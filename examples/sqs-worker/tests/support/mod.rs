//! Shared helpers of the tests: a moto SQS server on loopback, and the
//! worker service binary started against it and a PostgreSQL schema.

// Each test binary uses a part of this module.
#![allow(dead_code)]

pub(crate) mod e2e;

use std::process::{Command, Stdio};
use std::time::Duration;

use taskfence_test_support::{ChildProcess, free_port};

/// The SQS endpoint for a test: `TASKFENCE_SQS_ENDPOINT` when set (the
/// project's test script starts moto once), otherwise a `moto_server` this
/// test starts on a free loopback port and stops when dropped.
pub(crate) struct Moto {
    pub endpoint: String,
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
        // ChildProcess::spawn panics with the command when moto is missing:
        // install it with `python3 -m pip install 'moto[server]'` or run ./scripts/test.
        let mut server = ChildProcess::spawn("moto_server", &mut command);
        if let Err(status) = server.wait_listening(port, Duration::from_secs(30)) {
            panic!("moto_server exited ({status}) before listening on port {port}");
        }
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            _server: Some(server),
        }
    }

    /// The same server seen at another `endpoint` (a proxy in front of it).
    pub(crate) fn behind(endpoint: String) -> Self {
        Self {
            endpoint,
            _server: None,
        }
    }
}

/// Starts the worker service binary (`target/…/sqs-worker`) on `queue_url`
/// and the tables in `schema`, configured the way a deployment is: AWS from
/// the standard environment variables, the rest from `args` and defaults.
pub(crate) fn start_service(
    worker_id: &str,
    moto: &Moto,
    database_url: &str,
    schema: &str,
    queue_url: &str,
    args: &[&str],
) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sqs-worker"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_ENDPOINT_URL_SQS", &moto.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("DATABASE_URL", database_url)
        .env("TASKFENCE_SQS_QUEUE_URL", queue_url)
        .env("RUST_LOG", "warn,sqs_worker=info")
        .args(["--schema", schema, "--worker-id", worker_id])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    ChildProcess::spawn(worker_id, &mut command)
}

/// [`start_service`] with `--store dynamodb` on `table` (DynamoDB at
/// `dynamodb_endpoint` through `AWS_ENDPOINT_URL_DYNAMODB`): no PostgreSQL.
pub(crate) fn start_service_dynamodb(
    worker_id: &str,
    moto: &Moto,
    dynamodb_endpoint: &str,
    table: &str,
    queue_url: &str,
    args: &[&str],
) -> ChildProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sqs-worker"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AWS_ENDPOINT_URL_SQS", &moto.endpoint)
        .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("TASKFENCE_STORE", "dynamodb")
        .env("TASKFENCE_DYNAMODB_TABLE", table)
        .env("TASKFENCE_SQS_QUEUE_URL", queue_url)
        .env("RUST_LOG", "warn,sqs_worker=info")
        .args(["--worker-id", worker_id])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    ChildProcess::spawn(worker_id, &mut command)
}
