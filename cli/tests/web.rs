//! `taskfence web`: the dashboard served by the binary on PostgreSQL and
//! DynamoDB (moto), over a real socket, stopped by SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{failed, fixture, run, taskfence};
use taskfence::Status;
use taskfence::testing::Fixture;
use taskfence_test_support::{ChildProcess, free_port};

const TOKEN: &str = "cli-test-token-0123456789";

/// One HTTP/1.1 exchange: the status, the raw head and the body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the dashboard");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(cookie) = cookie {
        request.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    let body = form.unwrap_or("");
    if form.is_some() {
        request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// Starts `cmd` (a `taskfence web …`) on `port` and waits until it listens.
fn serve(cmd: &mut Command, port: u16) -> ChildProcess {
    let mut child = ChildProcess::spawn("taskfence web", cmd.stdout(Stdio::null()).stderr(Stdio::piped()));
    if let Err(status) = child.wait_listening(port, Duration::from_secs(30)) {
        panic!("taskfence web exited before listening: {status}");
    }
    child
}

/// SIGTERM stops it cleanly.
async fn stop(mut child: ChildProcess) {
    child.signal("TERM");
    let status = child
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("stopped within 10 s");
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_serves_postgres_with_actions() {
    let f = fixture().await;
    let task = failed(&*f.store(), "tenant-a", "k1", "provider quota exceeded").await;
    let port = free_port();
    let child = serve(
        taskfence()
            .env("TASKFENCE_WEB_TOKEN", TOKEN)
            .args(["--database-url", f.url(), "--schema", f.schema()])
            .args(["web", "--listen", &format!("127.0.0.1:{port}")]),
        port,
    );
    let (status, _, body) = http(port, "GET", "/health", None, None);
    assert_eq!((status, body.trim()), (200, "ok"));
    // Errors are task data: hidden until signed in.
    let (status, head, body) = http(port, "GET", "/", None, None);
    assert_eq!(status, 200);
    assert!(!body.contains("provider quota exceeded"), "{body}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    let (status, _, body) = http(port, "GET", &format!("/tasks/{}", task.id), None, None);
    assert!(status == 200 && body.contains("id=\"timeline\""), "{body}");
    // Sign in, then reopen through the same store operation as `taskfence reopen`.
    let (status, head, _) = http(
        port,
        "POST",
        "/login",
        None,
        Some(&format!("token={TOKEN}&next=/")),
    );
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();
    let (_, _, overview) = http(port, "GET", "/", Some(&cookie), None);
    assert!(overview.contains("provider quota exceeded"), "{overview}");
    let (_, _, page) = http(port, "GET", "/tasks", Some(&cookie), None);
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    let csrf = &page[at..at + 64];
    let (status, _, _) = http(
        port,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&by=ops&reason=fixed")),
    );
    assert_eq!(status, 303);
    assert_eq!(
        f.store().get(task.id).await.unwrap().unwrap().status,
        Status::Pending
    );
    stop(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_serves_dynamodb_read_only() {
    let f = taskfence_test_support::dynamo::fixture().await;
    let task = failed(&*f.store(), "tenant-a", "k1", "provider quota exceeded").await;
    let port = free_port();
    let endpoint = taskfence_test_support::dynamo::endpoint();
    let child = serve(
        taskfence()
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .env_remove("TASKFENCE_WEB_TOKEN")
            .args(["--dynamodb-table", f.table(), "--dynamodb-endpoint", &endpoint])
            .args(["web", "--open-reads", "--listen", &format!("127.0.0.1:{port}")]),
        port,
    );
    // Open reads: task data without signing in (there is no token to sign in with).
    let (status, _, body) = http(port, "GET", &format!("/tasks/{}", task.id), None, None);
    assert!(
        status == 200 && body.contains("provider quota exceeded"),
        "{body}"
    );
    let (status, _, body) = http(port, "GET", "/stranded", None, None);
    assert!(status == 200 && body.contains("id=\"no-stranded\""), "{body}");
    let (status, _, body) = http(
        port,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        None,
        Some("csrf=x&by=ops&reason=fixed"),
    );
    assert!(status == 403 && body.contains("read-only"), "{body}");
    assert_eq!(
        f.store().get(task.id).await.unwrap().unwrap().status,
        Status::Failed
    );
    stop(child).await;
}

#[test]
fn web_refuses_a_short_token_and_a_bad_address() {
    let short = run(taskfence().env("TASKFENCE_WEB_TOKEN", "short").args([
        "--database-url",
        "postgres://postgres@127.0.0.1:1/x",
        "web",
    ]));
    // Refused before connecting (nothing listens on that port).
    assert!(short.failed(2).contains("at least 16 characters"), "{short:#?}");
    let bad_addr = run(taskfence().args([
        "--database-url",
        "postgres://x@127.0.0.1/x",
        "web",
        "--listen",
        "nowhere",
    ]));
    assert!(bad_addr.failed(2).contains("--listen"), "{bad_addr:#?}");
}
