//! Faults for the DynamoDB test client. A local DynamoDB API (moto) never
//! throttles, never holds an item in another transaction, never leaves keys
//! unprocessed, never lags its indexes and never loses an answer, so without
//! help no retry path of `DynamoStore` would ever run in a test. [`Faults`]
//! sits between the client and the wire and, for the requests a rule names,
//! answers as DynamoDB would under those conditions, or runs a hook just
//! before or just after the request (another writer in between, an index
//! read that is stale by the time it is used).
//!
//! ```no_run
//! # async fn f() {
//! use taskfence_test_support::faults::{Action, Faults};
//! let faults = Faults::new();
//! let fired = faults.on("TransactWriteItems", &[], 2, Action::Cancel("ThrottlingError"));
//! let client = taskfence_test_support::dynamo::faulty_client(&faults);
//! // … two transactions are cancelled as throttled, then they pass …
//! assert_eq!(fired.count(), 2);
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::http::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorFuture, SharedHttpConnector};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;

/// Work a hook does: any async block, e.g. another store's write.
pub type Hook = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A [`Hook`] from an async closure.
pub fn hook<F, Fut>(f: F) -> Hook
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move || Box::pin(f()))
}

/// What a rule does to a request it matches.
#[derive(Clone)]
pub enum Action {
    /// Answers a `TransactWriteItems` with a `TransactionCanceledException`
    /// whose first reason is this code (`ThrottlingError`,
    /// `ProvisionedThroughputExceeded`, `TransactionConflict`): nothing written.
    Cancel(&'static str),
    /// Answers with an error of this type and HTTP status (e.g. `400,
    /// "TransactionConflictException"` for an `UpdateItem` meeting a
    /// transaction, `500, "InternalServerError"`): nothing written.
    Error(u16, &'static str),
    /// Answers a `BatchGetItem` / `BatchWriteItem` with every key or item
    /// unprocessed, as a throttled table does: nothing read or written.
    Unprocessed,
    /// Runs the hook, then sends the request: a write that lands between
    /// the caller's read and its conditional write.
    Before(Hook),
    /// Sends the request, runs the hook, then answers with the response
    /// from before it: an index read that is stale when it is used.
    After(Hook),
    /// Sends the request (it takes effect) and answers with a broken
    /// connection instead: a lost acknowledgement.
    LoseAnswer,
}

/// How many times a rule has fired.
#[derive(Debug, Clone, Default)]
pub struct Fired(Arc<AtomicUsize>);

impl Fired {
    /// Times fired so far.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

struct Rule {
    target: &'static str,
    matching: Vec<String>,
    left: usize,
    action: Action,
    fired: Fired,
}

/// The rules of one faulty client; see the [module documentation](self).
#[derive(Clone, Default)]
pub struct Faults(Arc<Mutex<Vec<Rule>>>);

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").finish_non_exhaustive()
    }
}

impl Faults {
    /// No rules yet: every request passes.
    pub fn new() -> Self {
        Self::default()
    }

    /// For the next `times` requests of operation `target` (its
    /// `X-Amz-Target`, e.g. `"TransactWriteItems"`) whose JSON body contains
    /// every string of `matching`, does `action`. Rules are tried in the
    /// order they were added; the first that matches fires.
    pub fn on(&self, target: &'static str, matching: &[&str], times: usize, action: Action) -> Fired {
        let fired = Fired::default();
        self.rules().push(Rule {
            target,
            matching: matching.iter().map(|m| (*m).to_owned()).collect(),
            left: times,
            action,
            fired: fired.clone(),
        });
        fired
    }

    /// Drops every rule: from now on every request passes.
    pub fn clear(&self) {
        self.rules().clear();
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The action for a request, if a rule takes it (and counts it).
    fn take(&self, target: &str, body: &str) -> Option<Action> {
        let mut rules = self.rules();
        let rule = rules.iter_mut().find(|r| {
            r.left > 0 && r.target == target && r.matching.iter().all(|m| body.contains(m.as_str()))
        })?;
        rule.left -= 1;
        rule.fired.0.fetch_add(1, Ordering::SeqCst);
        Some(rule.action.clone())
    }

    /// `inner` with these faults in front of it.
    pub(crate) fn connector(&self, inner: SharedHttpConnector) -> SharedHttpConnector {
        SharedHttpConnector::new(Faulty {
            faults: self.clone(),
            inner,
        })
    }
}

#[derive(Debug)]
struct Faulty {
    faults: Faults,
    inner: SharedHttpConnector,
}

impl HttpConnector for Faulty {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("?")
            .to_owned();
        let body = request
            .body()
            .bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        let action = self.faults.take(&target, &body);
        let inner = self.inner.clone();
        HttpConnectorFuture::new(async move {
            match action {
                None => inner.call(request).await,
                Some(Action::Cancel(code)) => Ok(cancelled(code, &body)),
                Some(Action::Error(status, code)) => Ok(error(status, code, "injected by the test")),
                Some(Action::Unprocessed) => Ok(unprocessed(&target, &body)),
                Some(Action::Before(hook)) => {
                    hook().await;
                    inner.call(request).await
                }
                Some(Action::After(hook)) => {
                    let response = inner.call(request).await;
                    hook().await;
                    response
                }
                Some(Action::LoseAnswer) => {
                    let _ = inner.call(request).await?;
                    Err(ConnectorError::io(
                        "the answer was lost on the way back (injected by the test)".into(),
                    ))
                }
            }
        })
    }
}

fn json_response(status: u16, body: String) -> HttpResponse {
    let mut response = HttpResponse::new(
        status.try_into().expect("a valid HTTP status"),
        SdkBody::from(body),
    );
    response
        .headers_mut()
        .insert("content-type", "application/x-amz-json-1.0");
    response
}

fn error(status: u16, code: &str, message: &str) -> HttpResponse {
    let body = serde_json::json!({
        "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
        "message": message,
    });
    json_response(status, body.to_string())
}

/// A `TransactionCanceledException` with one reason per item of the request,
/// the first `code`, the others `None`.
fn cancelled(code: &str, body: &str) -> HttpResponse {
    let items = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("TransactItems").and_then(|i| i.as_array()).map(Vec::len))
        .unwrap_or(1);
    let reasons: Vec<serde_json::Value> = (0..items)
        .map(|i| {
            let code = if i == 0 { code } else { "None" };
            serde_json::json!({ "Code": code })
        })
        .collect();
    let body = serde_json::json!({
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "Message": format!("Transaction cancelled, please refer cancellation reasons for specific reasons [{code}]"),
        "CancellationReasons": reasons,
    });
    json_response(400, body.to_string())
}

/// Every key (`BatchGetItem`) or item (`BatchWriteItem`) of the request back as unprocessed.
fn unprocessed(target: &str, body: &str) -> HttpResponse {
    let request: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let items = request.get("RequestItems").cloned().unwrap_or_default();
    let body = if target == "BatchGetItem" {
        serde_json::json!({ "Responses": {}, "UnprocessedKeys": items })
    } else {
        serde_json::json!({ "UnprocessedItems": items })
    };
    json_response(200, body.to_string())
}
