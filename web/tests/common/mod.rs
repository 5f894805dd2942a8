//! What the dashboard's tests share: tasks in given states, and requests
//! sent straight into the router.
#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use taskfence::inspect::Inspect;
use taskfence::testing::acquire;
use taskfence::{Failure, InputHash, NewTask, RequestKey, Response, RetryPolicy, Task, TaskStore};
use taskfence_web::Dashboard;
use tower::ServiceExt;

/// The action token of the tests' dashboards.
pub(crate) const TOKEN: &str = "test-token-0123456789";

/// Submits `scope/operation/key` with `policy` and `payload`.
pub(crate) async fn submit(
    store: &dyn TaskStore,
    scope: &str,
    key: &str,
    policy: RetryPolicy,
    payload: &[u8],
) -> Task {
    store
        .submit(
            NewTask::new(RequestKey::new(scope, "chat.reply", key), InputHash::of([key]))
                .policy(policy)
                .payload(payload.to_vec()),
        )
        .await
        .expect("submit")
        .into_task()
}

/// A task that failed terminally: one attempt allowed, a retryable failure.
pub(crate) async fn failed(store: &dyn TaskStore, scope: &str, key: &str, error: &str) -> Task {
    let task = submit(
        store,
        scope,
        key,
        RetryPolicy::default().max_attempts(1),
        b"prompt",
    )
    .await;
    let lease = acquire(store, task.id, "worker-1").await;
    let _ = store.fail(lease, Failure::retryable(error)).await.expect("fail");
    store.get(task.id).await.expect("get").expect("known")
}

/// A completed task whose response is `response`.
pub(crate) async fn completed(store: &dyn TaskStore, scope: &str, key: &str, response: &[u8]) -> Task {
    let task = submit(store, scope, key, RetryPolicy::default(), b"Hello").await;
    let lease = acquire(store, task.id, "worker-1").await;
    store
        .complete(lease, Response::new(response.to_vec()))
        .await
        .expect("complete")
        .accepted()
        .expect("the only lease saves")
}

/// A pending task.
pub(crate) async fn pending(store: &dyn TaskStore, scope: &str, key: &str) -> Task {
    submit(store, scope, key, RetryPolicy::default(), b"Hello").await
}

/// A dashboard with actions on `store`.
pub(crate) fn dashboard(store: Arc<dyn Inspect>) -> Dashboard {
    Dashboard::new(store).action_token(TOKEN).expect("a long token")
}

/// An answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: axum::http::HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    /// Asserts `status` and that the body is a full page (not a bare message) containing `text`.
    #[track_caller]
    pub(crate) fn page(&self, status: StatusCode, text: &str) -> &Self {
        assert_eq!(self.status, status, "{}", self.body);
        assert!(self.body.starts_with("<!DOCTYPE html>"), "a page: {}", self.body);
        assert!(self.body.contains(text), "expected {text:?} in {}", self.body);
        assert!(!self.body.contains("panicked"), "{}", self.body);
        self
    }

    /// Where a redirect points.
    #[track_caller]
    pub(crate) fn location(&self) -> &str {
        assert_eq!(self.status, StatusCode::SEE_OTHER, "{}", self.body);
        self.headers[header::LOCATION].to_str().unwrap()
    }

    /// The session cookie a sign-in set (`name=value`).
    pub(crate) fn session_cookie(&self) -> String {
        let set = self.headers[header::SET_COOKIE].to_str().unwrap();
        set.split(';').next().unwrap().to_owned()
    }

    /// The CSRF value in the page's forms.
    #[track_caller]
    pub(crate) fn csrf(&self) -> String {
        let at = self.body.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
        self.body[at..at + 64].to_owned()
    }
}

/// A request for `router`: `GET` without a body, else a form.
pub(crate) async fn send(
    router: &Router,
    method: &str,
    uri: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> Answer {
    send_from(router, None, method, uri, cookie, form).await
}

/// [`send`] from client address `client`, as a server passing `ConnectInfo` says.
pub(crate) async fn send_from(
    router: &Router,
    client: Option<std::net::SocketAddr>,
    method: &str,
    uri: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> Answer {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(client) = client {
        request = request.extension(axum::extract::ConnectInfo(client));
    }
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    let body = match form {
        Some(form) => {
            request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            Body::from(form.to_owned())
        }
        None => Body::empty(),
    };
    let response = router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 4 << 20).await.unwrap();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).expect("UTF-8 pages"),
    }
}

/// `GET uri`.
pub(crate) async fn get(router: &Router, uri: &str, cookie: Option<&str>) -> Answer {
    send(router, "GET", uri, cookie, None).await
}

/// Signs in with the tests' token; the session cookie and the CSRF value.
pub(crate) async fn sign_in(router: &Router, base: &str) -> (String, String) {
    let answer = send(
        router,
        "POST",
        &format!("{base}/login"),
        None,
        Some(&format!("token={TOKEN}&next=/")),
    )
    .await;
    let cookie = answer.session_cookie();
    let page = get(router, &format!("{base}/tasks"), Some(&cookie)).await;
    (cookie, page.csrf())
}

/// Waits until `check` holds, for up to 10 s.
pub(crate) async fn eventually(mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
