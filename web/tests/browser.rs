//! The dashboard in a real browser: headless Chromium driven over WebDriver
//! (chromedriver), against PostgreSQL. It opens the overview, follows a
//! failed task to its timeline, signs in, reopens it, and sees the new
//! assignment version appear once a worker claims it.
//!
//! Needs `chromedriver` and `chromium` (Debian: `apt-get install chromium
//! chromium-driver`; `./scripts/test` installs them when missing), or their
//! paths in `CHROMEDRIVER` and `CHROMIUM`. It fails, never skips, without them.
//!
//! Screenshots of the overview and the task page go to
//! `TASKFENCE_SCREENSHOTS_DIR` when set (`web/docs` regenerates the README's),
//! else to cargo's temporary directory for tests.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TOKEN, completed, dashboard, failed, pending};
use fantoccini::{Client, ClientBuilder, Locator};
use taskfence::testing::{Fixture, InspectFixture, acquire};
use taskfence::{Failure, RetryPolicy, Status};
use taskfence_test_support::{ChildProcess, free_port};

/// A program's path: `var` when set, else `default`, which must exist.
fn program(var: &str, default: &str) -> String {
    let path = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: install Debian's `chromium` and `chromium-driver` (./scripts/test does), or set {var}"
    );
    path
}

/// chromedriver on a free loopback port, killed when dropped.
fn chromedriver() -> (ChildProcess, u16) {
    let port = free_port();
    let mut child = ChildProcess::spawn(
        "chromedriver",
        Command::new(program("CHROMEDRIVER", "/usr/bin/chromedriver"))
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    child
        .wait_listening(port, Duration::from_secs(30))
        .expect("chromedriver exited before listening");
    (child, port)
}

/// A headless Chromium session, laptop-sized.
async fn browser(port: u16) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": program("CHROMIUM", "/usr/bin/chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--hide-scrollbars", "--force-device-scale-factor=1"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a WebDriver session with headless Chromium")
}

/// Waiting for an element, up to 15 s.
fn wait(client: &Client) -> fantoccini::wait::Wait<'_> {
    client.wait().at_most(Duration::from_secs(15))
}

fn screenshot_dir() -> PathBuf {
    std::env::var_os("TASKFENCE_SCREENSHOTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    std::fs::write(dir.join(name), png).expect("write the screenshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reopens_a_failed_task_in_the_browser() {
    let started = Instant::now();
    let f = taskfence_test_support::fixture().await;
    let store = f.store();
    // A store with some history: completed, pending, running and failed tasks in three scopes.
    for (scope, n) in [("tenant-acme", 4), ("tenant-globex", 3), ("tenant-initech", 2)] {
        for i in 0..n {
            completed(
                &*store,
                scope,
                &format!("send-{i}"),
                format!("Reply {i} for {scope}").as_bytes(),
            )
            .await;
        }
    }
    pending(&*store, "tenant-globex", "send-9").await;
    let running = pending(&*store, "tenant-acme", "send-8").await;
    let _lease = acquire(&*store, running.id, "worker-7").await;
    failed(
        &*store,
        "tenant-initech",
        "send-7",
        "invalid_request: prompt too long",
    )
    .await;
    // The task to follow: its first attempt fails and backs off, a second worker's fails for good.
    let task = common::submit(
        &*store,
        "tenant-acme",
        "0b7c4f0e-send-1",
        RetryPolicy::default()
            .max_attempts(2)
            .initial_backoff(Duration::from_millis(1))
            .jitter(0.0),
        br#"{"conversation":"c-7","message":"Summarise the meeting"}"#,
    )
    .await;
    let lease = acquire(&*store, task.id, "worker-1").await;
    let _ = store
        .fail(lease, Failure::retryable("provider overloaded (529)"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await; // past the backoff
    let lease = acquire(&*store, task.id, "worker-2").await;
    let _ = store
        .fail(lease, Failure::retryable("provider overloaded (529)"))
        .await
        .unwrap();
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Failed);

    // The dashboard on a real socket.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app: axum::Router = dashboard(f.inspector())
        .redispatch(std::sync::Arc::new(f.pg_store().clone()))
        .router();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (_driver, port) = chromedriver();
    let client = browser(port).await;
    // The steps run as a task of their own, so that a failed assertion still
    // lets the session (and its Chromium) be closed below.
    let steps = {
        let (client, store, base) = (client.clone(), store.clone(), base.clone());
        let task = task.clone();
        tokio::spawn(async move { steps(&client, &*store, &base, &task).await })
    };
    let result = steps.await;
    let _ = client.close().await;
    server.abort();
    match result {
        Ok(done) => done.expect("the browser session"),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    eprintln!(
        "browser test: {:.1} s (screenshots in {})",
        started.elapsed().as_secs_f64(),
        screenshot_dir().display()
    );
}

/// What the operator does, in the browser.
async fn steps(
    client: &Client,
    store: &dyn taskfence::TaskStore,
    base: &str,
    task: &taskfence::Task,
) -> Result<(), fantoccini::error::CmdError> {
    // The overview, with the failure among the recent ones; its error is
    // task data, hidden until the operator signs in.
    client.goto(&format!("{base}/")).await?;
    let failures = wait(client).for_element(Locator::Css("#recent-failures")).await?;
    let text = failures.text().await?;
    assert!(
        text.contains("hidden: sign in to see") && !text.contains("provider overloaded (529)"),
        "{text}"
    );

    // Follow it to its timeline.
    let row = format!("#recent-failures a[href='/tasks/{}']", task.id);
    client.find(Locator::Css(&row)).await?.click().await?;
    let timeline = wait(client).for_element(Locator::Css("#timeline")).await?;
    let story = timeline.text().await?;
    assert!(
        story.contains("worker-1") && story.contains("worker-2"),
        "{story}"
    );
    assert!(!story.contains("v3"), "{story}");

    // Reopen: sign in with the token on the way, then confirm.
    client.find(Locator::Css("#reopen")).await?.click().await?;
    let token = wait(client)
        .for_element(Locator::Css("input[name=token]"))
        .await?;
    token.send_keys(TOKEN).await?;
    client
        .find(Locator::Css("form.signin button[type=submit]"))
        .await?
        .click()
        .await?;
    let by = wait(client).for_element(Locator::Css("input[name=by]")).await?;
    by.send_keys("alice@ops").await?;
    client
        .find(Locator::Css("input[name=reason]"))
        .await?
        .send_keys("provider capacity raised")
        .await?;
    client.find(Locator::Css("#confirm")).await?.click().await?;
    let flash = wait(client).for_element(Locator::Css("#flash")).await?;
    assert!(flash.text().await?.contains("version 3"));
    let story = client.find(Locator::Css("#timeline")).await?.text().await?;
    assert!(story.contains("Reopened (#1) by alice@ops"), "{story}");

    // Signed in, the overview shows the errors (of the failure still standing).
    client.goto(&format!("{base}/")).await?;
    let failures = wait(client).for_element(Locator::Css("#recent-failures")).await?;
    let text = failures.text().await?;
    assert!(text.contains("invalid_request: prompt too long"), "{text}");
    screenshot(client, "overview.png").await;
    client.goto(&format!("{base}/tasks/{}", task.id)).await?;

    // A worker takes it: the new version appears.
    let lease = acquire(store, task.id, "worker-3").await;
    assert_eq!(lease.version(), 3);
    client.refresh().await?;
    let timeline = wait(client).for_element(Locator::Css("#timeline")).await?;
    let story = timeline.text().await?;
    assert!(story.contains("v3") && story.contains("worker-3"), "{story}");
    let status = client.find(Locator::Css("h1 .badge")).await?.text().await?;
    assert_eq!(status, "running");
    client.set_window_size(1280, 1750).await?;
    screenshot(client, "task.png").await;

    // On a phone: every page fits the width (tables scroll inside their own box).
    client.set_window_size(390, 844).await?;
    for path in [
        "/".to_owned(),
        "/tasks".to_owned(),
        format!("/tasks/{}", task.id),
        "/stranded".to_owned(),
        "/limits?key=conversation-7".to_owned(),
    ] {
        client.goto(&format!("{base}{path}")).await?;
        wait(client).for_element(Locator::Css("main")).await?;
        let fits = client
            .execute(
                "return document.documentElement.scrollWidth <= window.innerWidth;",
                vec![],
            )
            .await?;
        assert_eq!(
            fits,
            serde_json::Value::Bool(true),
            "{path} is wider than a phone"
        );
    }
    Ok(())
}
