//! `IdempotencyLayer` over real HTTP: an axum app on 127.0.0.1:0 called with
//! reqwest, each scenario on `MemoryStore` and on PostgreSQL (`DATABASE_URL`,
//! a fresh schema per test).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;
use taskfence::testing::{Fixture, MemoryFixture, PgFixture};
use taskfence::{Claim, ClaimRequest, RequestKey, Status, TaskStore};
use taskfence_axum::{IDEMPOTENT_REPLAYED, IdempotencyLayer, ProblemTypes};
use tokio::sync::{Semaphore, mpsc};

/// What the handlers share with the test: how often each ran, a signal when
/// a slow one started, and the gate it waits at.
struct Probe {
    runs: AtomicUsize,
    started: mpsc::UnboundedSender<()>,
    gate: Semaphore,
}

type Shared = Arc<Probe>;

/// `POST /orders`: creates "an order" (counts a run) and answers 201 with a
/// body, a `Location`, and a cookie that must never be replayed. A body
/// containing `slow` waits at the gate first.
async fn create_order(State(probe): State<Shared>, body: String) -> Response {
    let n = probe.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if body.contains("slow") {
        let _ = probe.started.send(());
        probe.gate.acquire().await.unwrap().forget();
    }
    let mut response = (
        StatusCode::CREATED,
        format!(r#"{{"order":{n},"input":{body:?}}}"#),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
    );
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=only-for-the-first"),
    );
    response
}

/// `POST /flaky`: 503 on its first run, 201 after.
async fn flaky(State(probe): State<Shared>) -> Response {
    match probe.runs.fetch_add(1, Ordering::SeqCst) {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response(),
        n => (StatusCode::CREATED, format!("done on run {}", n + 1)).into_response(),
    }
}

/// `POST /refuse`: a 422 refusal from the handler itself (not saved by default).
async fn refuse(State(probe): State<Shared>) -> Response {
    probe.runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::UNPROCESSABLE_ENTITY, "no").into_response()
}

/// `POST /panics`: panics on its first run, 201 after.
async fn panics(State(probe): State<Shared>) -> Response {
    if probe.runs.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("the handler panicked on purpose");
    }
    (StatusCode::CREATED, "fine now").into_response()
}

/// `POST /binary`: a body that is not UTF-8.
async fn binary() -> Response {
    (StatusCode::OK, vec![0xff_u8, 0x00, 0xfe]).into_response()
}

struct App {
    base: String,
    client: reqwest::Client,
    probe: Shared,
    started: mpsc::UnboundedReceiver<()>,
    store: Arc<dyn TaskStore>,
    fixture: Box<dyn Fixture>,
}

impl App {
    async fn start(
        fixture: Box<dyn Fixture>,
        tune: impl Fn(IdempotencyLayer<dyn TaskStore>) -> IdempotencyLayer<dyn TaskStore>,
    ) -> Self {
        let store = fixture.store();
        let (started_tx, started) = mpsc::unbounded_channel();
        let probe = Arc::new(Probe {
            runs: AtomicUsize::new(0),
            started: started_tx,
            gate: Semaphore::new(0),
        });
        let layer = tune(IdempotencyLayer::from_arc(Arc::clone(&store)).operation("orders"));
        let app = Router::new()
            .route("/orders", post(create_order))
            .route("/flaky", post(flaky))
            .route("/refuse", post(refuse))
            .route("/panics", post(panics))
            .route("/binary", post(binary))
            .route_layer(layer)
            .with_state(Arc::clone(&probe));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            probe,
            started,
            store,
            fixture,
        }
    }

    async fn post(&self, path: &str, key: Option<&str>, content_type: &str, body: &str) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header(header::CONTENT_TYPE, content_type)
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.unwrap();
        Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    async fn order(&self, key: &str, body: &str) -> Reply {
        self.post("/orders", Some(key), "text/plain", body).await
    }

    fn runs(&self) -> usize {
        self.probe.runs.load(Ordering::SeqCst)
    }

    /// The task the layer keeps for `key` (scope `default`, operation `orders`).
    async fn task(&self, key: &str) -> taskfence::Task {
        self.store
            .find(&RequestKey::new("default", "orders", key))
            .await
            .unwrap()
            .expect("the layer submitted a task for the key")
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `Idempotent-Replayed: true`; a first response has no such header.
    fn replayed(&self) -> bool {
        match self.header(IDEMPOTENT_REPLAYED) {
            Some(value) => {
                assert_eq!(value, "true");
                true
            }
            None => false,
        }
    }

    /// Asserts an RFC 9457 problem of this status and type; returns its body.
    fn problem(&self, status: u16, problem_type: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let body: Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(body["type"], problem_type, "{body}");
        assert_eq!(body["status"], status, "{body}");
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
        body
    }
}

async fn memory() -> Box<dyn Fixture> {
    Box::new(MemoryFixture::new())
}

async fn postgres() -> Box<dyn Fixture> {
    Box::new(PgFixture::new().await)
}

fn defaults(layer: IdempotencyLayer<dyn TaskStore>) -> IdempotencyLayer<dyn TaskStore> {
    layer
}

/// The first request runs the handler; each retry gets its response again —
/// status, body and the kept headers — marked `Idempotent-Replayed: true`.
async fn a_retry_replays_the_first_response_with_the_header(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let first = app.order("\"o-1\"", "two books").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(first.text(), r#"{"order":1,"input":"two books"}"#);
    assert_eq!(first.header("location"), Some("/orders/1"));
    assert_eq!(first.header("set-cookie"), Some("session=only-for-the-first"));

    for _ in 0..3 {
        let replay = app.order("\"o-1\"", "two books").await;
        assert_eq!((replay.status, &replay.body), (201, &first.body));
        assert!(replay.replayed());
        assert_eq!(replay.header("content-type"), Some("application/json"));
        assert_eq!(replay.header("location"), Some("/orders/1"));
        assert_eq!(replay.header("set-cookie"), None, "a cookie is never replayed");
    }
    assert_eq!(app.runs(), 1, "the handler ran once");
    let task = app.task("o-1").await;
    assert_eq!((task.status, task.attempts()), (Status::Completed, 1));

    // Another key is another order, even with the same body.
    let other = app.order("o-2", "two books").await;
    assert_eq!((other.status, other.replayed()), (201, false));
    assert_eq!(app.runs(), 2);
}

/// A copy that arrives while the first request still runs is a 409; once the
/// first is done, copies replay it.
async fn a_concurrent_duplicate_is_a_409_while_the_first_runs(fixture: Box<dyn Fixture>) {
    let mut app = App::start(fixture, defaults).await;
    let first = {
        let (client, url) = (app.client.clone(), format!("{}/orders", app.base));
        tokio::spawn(async move {
            let response = client
                .post(url)
                .header("Idempotency-Key", "\"slow-1\"")
                .body("slow order")
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.headers().clone(),
                response.bytes().await.unwrap(),
            )
        })
    };
    app.started
        .recv()
        .await
        .expect("the first request reached the handler");

    for _ in 0..3 {
        let duplicate = app.order("\"slow-1\"", "slow order").await;
        let body = duplicate.problem(409, "/problems/idempotency-key-in-flight");
        assert_eq!(duplicate.header("retry-after"), Some("1"), "{body}");
        assert!(!duplicate.replayed());
    }
    assert_eq!(app.task("slow-1").await.status, Status::Running);

    app.probe.gate.add_permits(1);
    let (status, headers, body) = first.await.unwrap();
    assert_eq!(status, 201);
    assert!(headers.get(IDEMPOTENT_REPLAYED).is_none());
    let replay = app.order("\"slow-1\"", "slow order").await;
    assert_eq!(
        (replay.status, replay.replayed(), replay.body.as_slice()),
        (201, true, &body[..])
    );
    assert_eq!(app.runs(), 1, "the duplicates never reached the handler");
}

/// The same key with another body (or on another path) is the draft's 422,
/// naming the task; nothing runs and the first response stays the answer.
async fn a_key_reused_with_another_body_is_a_422(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let first = app.order("\"o-1\"", "two books").await;
    assert_eq!(first.status, 201);
    let id = app.task("o-1").await.id;

    let reused = app.order("\"o-1\"", "three books").await;
    let body = reused.problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body["existing_task_id"], id.to_string());
    let elsewhere = app
        .post("/flaky", Some("\"o-1\""), "text/plain", "two books")
        .await;
    elsewhere.problem(422, "/problems/idempotency-key-reused");
    assert_eq!(app.runs(), 1);

    let replay = app.order("\"o-1\"", "two books").await;
    assert_eq!(
        (replay.status, replay.replayed(), &replay.body),
        (201, true, &first.body)
    );
}

/// A JSON body serialized again on retry (other key order, whitespace,
/// `2.0` for `2`) is the same request; a changed field is a 422.
async fn reserialized_json_is_the_same_request(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let json = "application/json";
    let first = app
        .post("/orders", Some("j-1"), json, r#"{"item":"book","qty":2}"#)
        .await;
    assert_eq!(first.status, 201);
    let retry = app
        .post(
            "/orders",
            Some("j-1"),
            json,
            "{ \"qty\": 2.0,\n \"item\": \"book\" }",
        )
        .await;
    assert_eq!(
        (retry.status, retry.replayed(), &retry.body),
        (201, true, &first.body)
    );
    app.post("/orders", Some("j-1"), json, r#"{"item":"book","qty":3}"#)
        .await
        .problem(422, "/problems/idempotency-key-reused");
    // As text, the same bytes reformatted are another body.
    let text = app.post("/orders", Some("t-1"), "text/plain", r#"{"a":1}"#).await;
    assert_eq!(text.status, 201);
    app.post("/orders", Some("t-1"), "text/plain", r#"{ "a": 1 }"#)
        .await
        .problem(422, "/problems/idempotency-key-reused");
    assert_eq!(app.runs(), 2);
}

/// A required key that is missing or malformed is a 400; nothing runs.
async fn a_missing_or_malformed_key_is_a_400(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    app.post("/orders", None, "text/plain", "x")
        .await
        .problem(400, "/problems/idempotency-key-missing");
    for bad in ["\"unterminated", "two words", "a,b", "\"\""] {
        app.order(bad, "x")
            .await
            .problem(400, "/problems/idempotency-key-malformed");
    }
    assert_eq!(app.runs(), 0);
}

/// A 5xx is sent but not saved: the task is released and a retry runs the
/// handler again, whose success is then the saved answer.
async fn a_failed_run_is_released_and_the_retry_runs(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let failed = app.post("/flaky", Some("f-1"), "text/plain", "").await;
    assert_eq!((failed.status, failed.replayed()), (503, false));
    assert_eq!(app.task("f-1").await.status, Status::Pending, "released");

    let retry = app.post("/flaky", Some("f-1"), "text/plain", "").await;
    assert_eq!(
        (retry.status, retry.text().as_str(), retry.replayed()),
        (201, "done on run 2", false)
    );
    let replay = app.post("/flaky", Some("f-1"), "text/plain", "").await;
    assert_eq!(
        (replay.status, replay.text().as_str(), replay.replayed()),
        (201, "done on run 2", true)
    );
    assert_eq!(app.runs(), 2);
    assert_eq!(app.task("f-1").await.attempts(), 2);
}

/// A handler's 4xx is not saved by default (it runs again); `save_if` can
/// keep it.
async fn refusals_are_saved_only_when_chosen(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    for _ in 0..2 {
        let refused = app.post("/refuse", Some("r-1"), "text/plain", "").await;
        assert_eq!((refused.status, refused.replayed()), (422, false));
    }
    assert_eq!(app.runs(), 2);

    let fixture = app.fixture;
    let app = App::start(fixture, |layer| layer.save_if(|status| !status.is_server_error())).await;
    let refused = app.post("/refuse", Some("r-2"), "text/plain", "").await;
    assert_eq!((refused.status, refused.replayed()), (422, false));
    let replay = app.post("/refuse", Some("r-2"), "text/plain", "").await;
    assert_eq!(
        (replay.status, replay.replayed(), replay.text().as_str()),
        (422, true, "no")
    );
    assert_eq!(app.runs(), 1);
}

/// A panicking handler releases the task (the client sees the connection
/// close, as without the layer); the retry runs at once.
async fn a_panicking_handler_releases_the_key(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let request = app
        .client
        .post(format!("{}/panics", app.base))
        .header("Idempotency-Key", "p-1")
        .send()
        .await;
    assert!(request.is_err(), "the panic closes the connection: {request:?}");
    let retry = app.post("/panics", Some("p-1"), "text/plain", "").await;
    assert_eq!((retry.status, retry.text().as_str()), (201, "fine now"));
    assert_eq!(app.task("p-1").await.attempts(), 2);
}

/// A process that died mid-handler holds its lease until it expires: a
/// retry is a 409 until then, and the first retry after it takes the task
/// over and runs the handler again. The dead process is a claim made
/// directly on the store (what the layer's claim is), never finished.
async fn a_dead_processs_key_is_taken_over_after_its_lease(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    // A first run that failed leaves the key's task pending, bound to the request.
    assert_eq!(
        app.post("/flaky", Some("d-1"), "text/plain", "x").await.status,
        503
    );
    let task = app.task("d-1").await;
    let dead = ClaimRequest::new("a-process-that-died", Duration::from_secs(30));
    let Claim::Acquired(_lease_never_used_again) = app.store.claim(task.id, dead).await.unwrap() else {
        panic!("the released task is claimable");
    };
    app.post("/flaky", Some("d-1"), "text/plain", "x")
        .await
        .problem(409, "/problems/idempotency-key-in-flight");
    assert_eq!(app.runs(), 1);

    app.fixture.advance(Duration::from_secs(31)).await;
    let taken_over = app.post("/flaky", Some("d-1"), "text/plain", "x").await;
    assert_eq!(
        (taken_over.status, taken_over.replayed()),
        (201, false),
        "{}",
        taken_over.text()
    );
    let task = app.task("d-1").await;
    assert_eq!((task.status, task.attempts()), (Status::Completed, 3));
    let replay = app.post("/flaky", Some("d-1"), "text/plain", "x").await;
    assert_eq!((replay.status, replay.replayed()), (201, true));
}

/// When a key's runs are spent the layer says so (410), under the problem
/// types chosen, absolute here.
async fn a_key_whose_runs_ran_out_is_a_410(fixture: Box<dyn Fixture>) {
    let types = || ProblemTypes::new("https://api.example.com/problems/");
    let app = App::start(fixture, move |layer| layer.max_attempts(1).problem_types(types())).await;
    assert_eq!(
        app.post("/flaky", Some("x-1"), "text/plain", "").await.status,
        503
    );
    let spent = app.post("/flaky", Some("x-1"), "text/plain", "").await;
    let body = spent.problem(410, "https://api.example.com/problems/idempotency-key-exhausted");
    assert_eq!(body["existing_task_id"], app.task("x-1").await.id.to_string());
    app.post("/orders", None, "text/plain", "")
        .await
        .problem(400, "https://api.example.com/problems/idempotency-key-missing");
    assert_eq!(app.runs(), 1);
}

/// With an optional key, a request without one runs unguarded every time.
async fn an_optional_key_lets_unkeyed_requests_through(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, |layer| layer.optional()).await;
    for n in 1..=2 {
        let plain = app.post("/orders", None, "text/plain", "x").await;
        assert_eq!((plain.status, plain.replayed()), (201, false));
        assert_eq!(app.runs(), n);
    }
    app.order("a b", "x")
        .await
        .problem(400, "/problems/idempotency-key-malformed");
    let keyed = app.order("k-1", "x").await;
    assert_eq!(app.order("k-1", "x").await.body, keyed.body);
    assert_eq!(app.runs(), 3);
}

/// A body that is not UTF-8 is saved (as base64) and replayed byte for byte.
async fn a_binary_response_is_replayed_byte_for_byte(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let first = app.post("/binary", Some("b-1"), "text/plain", "").await;
    let replay = app.post("/binary", Some("b-1"), "text/plain", "").await;
    assert_eq!(first.body, vec![0xff, 0x00, 0xfe]);
    assert_eq!(
        (replay.status, replay.replayed(), &replay.body),
        (200, true, &first.body)
    );
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::memory().await).await;
                }
            )*
        }
        mod postgres_store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::postgres().await).await;
                }
            )*
        }
    };
}

on_every_store!(
    a_retry_replays_the_first_response_with_the_header,
    a_concurrent_duplicate_is_a_409_while_the_first_runs,
    a_key_reused_with_another_body_is_a_422,
    reserialized_json_is_the_same_request,
    a_missing_or_malformed_key_is_a_400,
    a_failed_run_is_released_and_the_retry_runs,
    refusals_are_saved_only_when_chosen,
    a_panicking_handler_releases_the_key,
    a_dead_processs_key_is_taken_over_after_its_lease,
    a_key_whose_runs_ran_out_is_a_410,
    an_optional_key_lets_unkeyed_requests_through,
    a_binary_response_is_replayed_byte_for_byte,
);
