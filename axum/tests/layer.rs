//! `IdempotencyLayer` over real HTTP: an axum app on 127.0.0.1:0 called with
//! reqwest, each scenario on `MemoryStore` and on PostgreSQL (`DATABASE_URL`,
//! a fresh schema per test). The app authenticates `Authorization: Bearer
//! <caller>` and scopes keys per caller, as a deployment should; the client
//! calls as `ann` unless a test says otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use serde_json::Value;
use taskfence::testing::{Fixture, MemoryFixture, PgFixture};
use taskfence::{Claim, ClaimRequest, RequestKey, Status, TaskStore};
use taskfence_axum::{IDEMPOTENT_REPLAYED, IdempotencyLayer, KeyScope, Problem, ProblemTypes};
use tokio::sync::{Semaphore, mpsc};

/// The caller the app's authentication verified, in the request's extensions.
#[derive(Clone)]
struct Caller(String);

/// The app's authentication: `Authorization: Bearer <caller>` becomes a
/// [`Caller`]; a request without one goes on without a caller.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let caller = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|caller| Caller(caller.to_owned()));
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

/// Keys per authenticated caller; no caller is a 401.
fn per_caller() -> KeyScope {
    KeyScope::per_caller(|parts| {
        parts
            .extensions
            .get::<Caller>()
            .map(|caller| caller.0.clone())
            .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED).with_detail("no caller"))
    })
}

/// The caller every request is sent as unless a test says otherwise.
const ANN: &str = "ann";

/// What the handlers share with the test: how often each ran, a signal when
/// a slow one started, the gate it waits at, and how many chunks of a
/// streamed response were produced.
struct Probe {
    runs: AtomicUsize,
    started: mpsc::UnboundedSender<()>,
    gate: Semaphore,
    chunks: AtomicUsize,
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

/// `POST /stream`: answers 201 at once with a streamed body whose first
/// run's last chunk waits at the gate: the handler has returned, its
/// response is still being read.
async fn stream(State(probe): State<Shared>) -> Response {
    let run = probe.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let head = futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(Bytes::from(format!("run {run}: first,")))
    });
    let tail = futures_util::stream::once(async move {
        if run == 1 {
            let _ = probe.started.send(());
            probe.gate.acquire().await.unwrap().forget();
        }
        Ok(Bytes::from_static(b"last"))
    });
    (StatusCode::CREATED, Body::from_stream(head.chain(tail))).into_response()
}

/// The chunks `/huge` would stream: 16 MiB, sixteen times the default
/// response limit.
const HUGE_CHUNKS: usize = 1024;
const CHUNK: usize = 16 * 1024;

/// `POST /huge`: a 201 whose streamed body is far over the response limit;
/// counts every chunk it produces.
async fn huge(State(probe): State<Shared>) -> Response {
    probe.runs.fetch_add(1, Ordering::SeqCst);
    let chunks = futures_util::stream::iter(0..HUGE_CHUNKS).map(move |_| {
        probe.chunks.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; CHUNK]))
    });
    (StatusCode::CREATED, Body::from_stream(chunks)).into_response()
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
    /// The app with keys per caller, the layer tuned by `tune`.
    async fn start(
        fixture: Box<dyn Fixture>,
        tune: impl Fn(IdempotencyLayer<dyn TaskStore>) -> IdempotencyLayer<dyn TaskStore>,
    ) -> Self {
        Self::start_scoped(fixture, per_caller(), tune).await
    }

    async fn start_scoped(
        fixture: Box<dyn Fixture>,
        scope: KeyScope,
        tune: impl Fn(IdempotencyLayer<dyn TaskStore>) -> IdempotencyLayer<dyn TaskStore>,
    ) -> Self {
        let store = fixture.store();
        let (started_tx, started) = mpsc::unbounded_channel();
        let probe = Arc::new(Probe {
            runs: AtomicUsize::new(0),
            started: started_tx,
            gate: Semaphore::new(0),
            chunks: AtomicUsize::new(0),
        });
        let layer = tune(IdempotencyLayer::from_arc(Arc::clone(&store), scope).operation("orders"));
        let app = Router::new()
            .route("/orders", post(create_order))
            .route("/flaky", post(flaky))
            .route("/refuse", post(refuse))
            .route("/panics", post(panics))
            .route("/binary", post(binary))
            .route("/stream", post(stream))
            .route("/huge", post(huge))
            .route_layer(layer)
            // Outside the layer, as in a deployment: the scope reads a verified caller.
            .route_layer(middleware::from_fn(authenticate))
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
        self.post_as(Some(ANN), path, key, content_type, body).await
    }

    /// A request as `caller` (`None`: no credentials).
    async fn post_as(
        &self,
        caller: Option<&str>,
        path: &str,
        key: Option<&str>,
        content_type: &str,
        body: &str,
    ) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header(header::CONTENT_TYPE, content_type)
            .body(body.to_owned());
        if let Some(caller) = caller {
            request = request.header(header::AUTHORIZATION, format!("Bearer {caller}"));
        }
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

    /// The task the layer keeps for `ann`'s `key` (operation `orders`).
    async fn task(&self, key: &str) -> taskfence::Task {
        self.task_of(ANN, key).await
    }

    /// The task the layer keeps for `key` in `scope`.
    async fn task_of(&self, scope: &str, key: &str) -> taskfence::Task {
        self.store
            .find(&RequestKey::new(scope, "orders", key))
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
                .header("Authorization", "Bearer ann")
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
/// naming nothing of the first request (no task id); nothing runs and the first response stays the answer.
async fn a_key_reused_with_another_body_is_a_422(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let first = app.order("\"o-1\"", "two books").await;
    assert_eq!(first.status, 201);
    let id = app.task("o-1").await.id;

    let reused = app.order("\"o-1\"", "three books").await;
    let body = reused.problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body.get("existing_task_id"), None, "{body}");
    assert!(!reused.text().contains(&id.to_string()), "{body}");
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
        .header("Authorization", "Bearer ann")
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
    assert_eq!(body.get("existing_task_id"), None, "{body}");
    assert!(
        !spent.text().contains(&app.task("x-1").await.id.to_string()),
        "{body}"
    );
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

/// Keys are per authenticated caller: another caller who sends ann's key,
/// with ann's body or another, gets a run of their own, never ann's saved
/// response nor a refusal about ann's request.
async fn a_callers_key_is_never_answered_for_another_caller(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let ann = app.order("\"k-1\"", "two books").await;
    assert_eq!((ann.status, ann.replayed()), (201, false));

    let bob = app
        .post_as(Some("bob"), "/orders", Some("\"k-1\""), "text/plain", "two books")
        .await;
    assert_eq!((bob.status, bob.replayed()), (201, false), "{}", bob.text());
    assert_eq!(bob.text(), r#"{"order":2,"input":"two books"}"#);
    let cid = app
        .post_as(Some("cid"), "/orders", Some("\"k-1\""), "text/plain", "one pen")
        .await;
    assert_eq!((cid.status, cid.replayed()), (201, false), "{}", cid.text());
    assert_eq!(app.runs(), 3, "each caller's key ran once");

    // Each caller's retry replays their own response.
    let ann_again = app.order("\"k-1\"", "two books").await;
    assert_eq!((ann_again.replayed(), &ann_again.body), (true, &ann.body));
    let bob_again = app
        .post_as(Some("bob"), "/orders", Some("\"k-1\""), "text/plain", "two books")
        .await;
    assert_eq!((bob_again.replayed(), &bob_again.body), (true, &bob.body));
    assert_ne!(
        app.task_of("ann", "k-1").await.id,
        app.task_of("bob", "k-1").await.id
    );
    assert_eq!(app.runs(), 3);
}

/// A request whose caller the scope cannot name gets the scope's problem
/// (401 here) before anything is read, run or written.
async fn a_request_without_a_caller_is_refused_and_writes_nothing(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let before = app.fixture.record_count().await;
    let anonymous = app
        .post_as(None, "/orders", Some("\"k-1\""), "text/plain", "two books")
        .await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    assert_eq!(app.runs(), 0);
    assert_eq!(app.fixture.record_count().await, before, "nothing was written");
}

/// Under the explicit single-tenant scope, a key reused with another body
/// by another client is a 422 that names nothing of the first request: no
/// task id, no body, no path.
async fn a_shared_scope_refusal_discloses_nothing_of_the_first_request(fixture: Box<dyn Fixture>) {
    let app = App::start_scoped(fixture, KeyScope::single_tenant(), defaults).await;
    let ann = app.order("\"k-1\"", "ann's secret order").await;
    assert_eq!(ann.status, 201);
    let task = app.task_of("default", "k-1").await;

    let bob = app
        .post_as(
            Some("bob"),
            "/flaky",
            Some("\"k-1\""),
            "text/plain",
            "something else",
        )
        .await;
    let body = bob.problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body.get("existing_task_id"), None, "{body}");
    for secret in [
        task.id.to_string(),
        "ann's secret".to_owned(),
        "/orders".to_owned(),
    ] {
        assert!(!bob.text().contains(&secret), "{secret} in {body}");
    }
    assert_eq!(app.runs(), 1);
}

/// The key's task keeps `METHOD /path`: a query string (a token, say) is
/// stored only with `record_query`.
async fn the_query_string_is_stored_only_when_asked(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let first = app
        .post("/orders?token=s3cret", Some("q-1"), "text/plain", "x")
        .await;
    assert_eq!(first.status, 201);
    let task = app.task("q-1").await;
    assert_eq!(String::from_utf8_lossy(&task.payload), "POST /orders");
    // The query is still part of the request's fingerprint.
    app.post("/orders?token=other", Some("q-1"), "text/plain", "x")
        .await
        .problem(422, "/problems/idempotency-key-reused");

    let fixture = app.fixture;
    let app = App::start(fixture, |layer| layer.record_query()).await;
    let kept = app.post("/orders?src=app", Some("q-2"), "text/plain", "x").await;
    assert_eq!(kept.status, 201);
    let task = app.task("q-2").await;
    assert_eq!(String::from_utf8_lossy(&task.payload), "POST /orders?src=app");
}

/// A handler that returned but whose body streams for longer than the lease
/// keeps the key: the lease is renewed until the response is saved, so a
/// concurrent retry is a 409 and the handler never runs a second time. The
/// store's clock moves three leases on while the body is read.
async fn a_response_streamed_past_the_lease_never_runs_the_handler_twice(fixture: Box<dyn Fixture>) {
    let lease = Duration::from_millis(600);
    let mut app = App::start(fixture, move |layer| layer.lease_duration(lease)).await;
    let first = {
        let (client, url) = (app.client.clone(), format!("{}/stream", app.base));
        tokio::spawn(async move {
            let response = client
                .post(url)
                .header("Authorization", "Bearer ann")
                .header("Idempotency-Key", "s-1")
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.bytes().await.unwrap())
        })
    };
    app.started
        .recv()
        .await
        .expect("the first run returned and its body is being read");
    for _ in 0..6 {
        // Real time for a renewal (every 200 ms), then the store's clock on.
        tokio::time::sleep(Duration::from_millis(400)).await;
        app.fixture.advance(Duration::from_millis(250)).await;
    }
    let retry = app.post("/stream", Some("s-1"), "text/plain", "").await;
    retry.problem(409, "/problems/idempotency-key-in-flight");
    assert_eq!(app.runs(), 1, "the retry did not run the handler again");

    app.probe.gate.add_permits(1);
    let (status, body) = first.await.unwrap();
    assert_eq!((status, &body[..]), (201, &b"run 1: first,last"[..]));
    let replay = app.post("/stream", Some("s-1"), "text/plain", "").await;
    assert_eq!(
        (replay.status, replay.replayed(), replay.body.as_slice()),
        (201, true, &body[..])
    );
    assert_eq!(app.runs(), 1);
}

/// A streamed response far over the response limit is refused with a
/// problem once the limit is passed: the rest of the stream is never
/// produced, and the key is closed (the handler ran; it must not run again).
async fn an_over_limit_streamed_response_is_refused_unread(fixture: Box<dyn Fixture>) {
    let app = App::start(fixture, defaults).await;
    let refused = app.post("/huge", Some("h-1"), "text/plain", "").await;
    refused.problem(500, "/problems/response-too-large");
    let produced = app.probe.chunks.load(Ordering::SeqCst);
    let limit_chunks = taskfence::limits::MAX_RESPONSE_LEN / CHUNK;
    assert!(
        produced <= limit_chunks + 2,
        "{produced} chunks of {HUGE_CHUNKS} produced; the limit is {limit_chunks}"
    );
    assert_eq!(app.task("h-1").await.status, Status::Failed);
    app.post("/huge", Some("h-1"), "text/plain", "")
        .await
        .problem(410, "/problems/idempotency-key-exhausted");
    assert_eq!(app.runs(), 1);

    // A smaller limit of the layer's own.
    let fixture = app.fixture;
    let app = App::start(fixture, |layer| layer.response_limit(CHUNK * 4)).await;
    app.post("/huge", Some("h-2"), "text/plain", "")
        .await
        .problem(500, "/problems/response-too-large");
    let produced = app.probe.chunks.load(Ordering::SeqCst);
    assert!(produced <= 6, "{produced} chunks produced past a 4-chunk limit");
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
    a_callers_key_is_never_answered_for_another_caller,
    a_request_without_a_caller_is_refused_and_writes_nothing,
    a_shared_scope_refusal_discloses_nothing_of_the_first_request,
    the_query_string_is_stored_only_when_asked,
    a_response_streamed_past_the_lease_never_runs_the_handler_twice,
    an_over_limit_streamed_response_is_refused_unread,
);
