//! The extractor, the problems and the submit responses over real HTTP: an
//! axum app on 127.0.0.1:0 backed by `MemoryStore`, called with reqwest.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use reqwest::header::HeaderValue;
use serde_json::Value;
use taskfence::{
    Claim, ClaimRequest, Error, InputHash, MemoryStore, NewTask, RequestKey, Response, TaskId, TaskStore,
};
use taskfence_axum::{
    IdempotencyKey, IdempotencyKeyRejection, Problem, ProblemTypes, SubmitResponse, TaskBody, fingerprint,
};

const OPERATION: &str = "report.render";
const CUSTOM: ProblemTypes = ProblemTypes::new("https://api.example.com/problems/");

/// `POST /jobs`: the body is the job's input; the key is bound to its hash.
async fn create(State(store): State<MemoryStore>, key: IdempotencyKey, body: String) -> SubmitResponse {
    let new = NewTask::new(
        RequestKey::new("tenant-1", OPERATION, key.as_str()),
        InputHash::of([&body]),
    )
    .payload(body);
    SubmitResponse::new(store.submit(new).await).location("/jobs/{id}")
}

/// `POST /custom/jobs`: the same under the application's own problem types.
async fn create_custom(
    State(store): State<MemoryStore>,
    key: Result<IdempotencyKey, IdempotencyKeyRejection>,
    body: String,
) -> Result<SubmitResponse, Problem> {
    let key = key.map_err(|r| CUSTOM.key_rejection(&r))?;
    let new = NewTask::new(
        RequestKey::new("tenant-1", OPERATION, key.as_str()),
        InputHash::of([&body]),
    );
    Ok(SubmitResponse::new(store.submit(new).await).problem_types(CUSTOM))
}

/// `GET /jobs/{id}`: 404 through `From<Error> for Problem`.
async fn show(
    State(store): State<MemoryStore>,
    Path(id): Path<String>,
) -> Result<axum::Json<TaskBody>, Problem> {
    let id: TaskId = id.parse().map_err(|_| {
        ProblemTypes::default().problem(http::StatusCode::NOT_FOUND, "not-found", "no such task")
    })?;
    let task = store.get(id).await?.ok_or(Error::NotFound(id))?;
    Ok(axum::Json(TaskBody::from(&task)))
}

/// `POST /optional`: deduplicated when the client sends a key, plain work otherwise.
async fn optional(
    State(store): State<MemoryStore>,
    key: Option<IdempotencyKey>,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match key {
        Some(key) => {
            let new = NewTask::new(
                RequestKey::new("tenant-1", OPERATION, key.as_str()),
                InputHash::of([&body]),
            );
            SubmitResponse::new(store.submit(new).await).into_response()
        }
        None => (http::StatusCode::ACCEPTED, "not deduplicated").into_response(),
    }
}

/// `POST /transfers`: a JSON body, fingerprinted by the fields it parses to.
#[derive(serde::Deserialize, serde::Serialize)]
struct Transfer {
    to: String,
    amount: f64,
    note: Option<String>,
}

async fn transfer(
    State(store): State<MemoryStore>,
    key: IdempotencyKey,
    axum::Json(transfer): axum::Json<Transfer>,
) -> Result<SubmitResponse, Problem> {
    let input = fingerprint(&transfer)
        .map_err(|e| Problem::new(http::StatusCode::BAD_REQUEST).with_detail(e.to_string()))?;
    let new = NewTask::new(RequestKey::new("tenant-1", "transfer", key.as_str()), input);
    Ok(SubmitResponse::new(store.submit(new).await))
}

/// `POST /broken`: a store that fails with a secret in its error.
async fn broken(_key: IdempotencyKey) -> SubmitResponse {
    let secret = std::io::Error::other("connection to 10.0.0.5 refused for user=app password=hunter2");
    SubmitResponse::new(Err(Error::storage(secret)))
}

struct App {
    base: String,
    client: reqwest::Client,
    store: MemoryStore,
}

impl App {
    async fn start() -> Self {
        let store = MemoryStore::new();
        let app = Router::new()
            .route("/jobs", post(create))
            .route("/jobs/{id}", get(show))
            .route("/custom/jobs", post(create_custom))
            .route("/broken", post(broken))
            .route("/optional", post(optional))
            .route("/transfers", post(transfer))
            .with_state(store.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            base,
            client: reqwest::Client::builder().no_proxy().build().unwrap(),
            store,
        }
    }

    /// `POST {path}` with each of `keys` as an `Idempotency-Key` header.
    async fn post(&self, path: &str, keys: &[HeaderValue], body: &str) -> Reply {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body.to_owned());
        for key in keys {
            request = request.header("Idempotency-Key", key.clone());
        }
        Reply::read(request).await
    }

    async fn job(&self, key: &str, body: &str) -> Reply {
        self.post("/jobs", &[HeaderValue::from_str(key).unwrap()], body)
            .await
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    async fn read(request: reqwest::RequestBuilder) -> Self {
        let response = request.send().await.unwrap();
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Idempotent-Replayed: true`; a first response has no such header at all.
    fn replayed(&self) -> bool {
        match self.header(taskfence_axum::IDEMPOTENT_REPLAYED) {
            Some(value) => {
                assert_eq!(value, "true");
                true
            }
            None => false,
        }
    }

    /// Asserts an RFC 9457 problem of this status and type; returns its body.
    fn assert_problem(&self, status: u16, problem_type: &str) -> Value {
        assert_eq!(self.status, status, "{}", String::from_utf8_lossy(&self.body));
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let body = self.json();
        assert_eq!(body["type"], problem_type, "{body}");
        assert_eq!(body["status"], status, "{body}");
        let reason = http::StatusCode::from_u16(status)
            .unwrap()
            .canonical_reason()
            .unwrap();
        assert_eq!(body["title"], reason, "{body}");
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
        body
    }

    fn task_id(&self) -> TaskId {
        self.json()["id"].as_str().unwrap().parse().unwrap()
    }
}

#[tokio::test]
async fn a_missing_key_is_a_400_problem() {
    let app = App::start().await;
    let reply = app.post("/jobs", &[], "input").await;
    let body = reply.assert_problem(400, "/problems/idempotency-key-missing");
    assert!(
        body["detail"].as_str().unwrap().contains("Idempotency-Key"),
        "{body}"
    );
}

#[tokio::test]
async fn malformed_keys_are_400_problems_and_write_nothing() {
    let app = App::start().await;
    let too_long = format!("\"{}\"", "k".repeat(taskfence::limits::MAX_KEY_LEN + 1));
    let mut bad: Vec<HeaderValue> = [
        "\"\"",            // empty
        "\"   \"",         // blank
        "\"unterminated",  // not a string
        "\"a\";expires=1", // parameters
        "\"a\\nb\"",       // invalid escape
        "two words",       // bare, with a space
        "a,b",             // a list
        too_long.as_str(), // over the limit
    ]
    .into_iter()
    .map(|v| HeaderValue::from_str(v).unwrap())
    .collect();
    bad.push(HeaderValue::from_bytes(b"\"caf\xc3\xa9\"").unwrap()); // not ASCII
    bad.push(HeaderValue::from_bytes(b"\"a\tb\"").unwrap()); // a control byte (the only one HTTP lets through)
    bad.push(HeaderValue::from_bytes(b"a\tb").unwrap()); // the same, bare
    bad.push(HeaderValue::from_bytes(b"").unwrap()); // empty, bare
    for value in bad {
        let reply = app.post("/jobs", &[value], "input").await;
        reply.assert_problem(400, "/problems/idempotency-key-malformed");
    }
    let twice = app
        .post(
            "/jobs",
            &[
                HeaderValue::from_static("\"a\""),
                HeaderValue::from_static("\"b\""),
            ],
            "input",
        )
        .await;
    let body = twice.assert_problem(400, "/problems/idempotency-key-malformed");
    assert_eq!(body["detail"], "send exactly one Idempotency-Key header");

    // A refused request does not consume its key.
    assert_eq!(app.job("\"a\"", "input").await.status, 201);
}

#[tokio::test]
async fn first_request_is_201_and_a_replay_is_201_marked_replayed_with_the_same_task_and_bytes() {
    let app = App::start().await;
    let first = app.job("\"job-1\"", "render report 7").await;
    assert_eq!(first.status, 201, "{}", String::from_utf8_lossy(&first.body));
    assert_eq!(first.header("content-type"), Some("application/json"));
    let id = first.task_id();
    assert_eq!(first.header("location"), Some(format!("/jobs/{id}").as_str()));
    assert_eq!(
        first.body,
        format!(r#"{{"id":"{id}","status":"pending"}}"#).into_bytes()
    );
    assert!(!first.replayed());

    let replay = app.job("\"job-1\"", "render report 7").await;
    assert_eq!(replay.status, 201, "the first response's status");
    assert!(replay.replayed());
    assert_eq!(replay.task_id(), id);
    assert_eq!(replay.header("location"), Some(format!("/jobs/{id}").as_str()));
    assert_eq!(
        replay.body, first.body,
        "byte-identical while the task is unchanged"
    );
    let again = app.job("\"job-1\"", "render report 7").await;
    assert_eq!((again.status, &again.body), (201, &first.body));
    assert!(again.replayed());

    // A new key is new work, even for the same body.
    let other = app.job("\"job-2\"", "render report 7").await;
    assert_eq!(other.status, 201);
    assert!(!other.replayed());
    assert_ne!(other.task_id(), id);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_422_naming_the_existing_task() {
    let app = App::start().await;
    let first = app.job("\"job-1\"", "render report 7").await;
    let id = first.task_id();

    let reused = app.job("\"job-1\"", "render report 8").await;
    let body = reused.assert_problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body["existing_task_id"], id.to_string(), "{body}");
    assert_eq!(reused.header("location"), None);
    // Member order is fixed: type, title, status, detail, then extensions.
    let text = String::from_utf8(reused.body.clone()).unwrap();
    assert!(text.starts_with(r#"{"type":"/problems/idempotency-key-reused","title":"Unprocessable Entity","status":422,"detail":"#), "{text}");
    assert!(
        text.ends_with(&format!(r#","existing_task_id":"{id}"}}"#)),
        "{text}"
    );

    // Nothing was written: the key still names the first task, unchanged.
    let replay = app.job("\"job-1\"", "render report 7").await;
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert!(replay.replayed());
}

#[tokio::test]
async fn the_quoted_and_the_bare_spelling_name_the_same_key() {
    let app = App::start().await;
    let quoted = app.job("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"", "input").await;
    let bare = app.job("8e03978e-40d5-43e8-bc93-6894a57f9324", "input").await;
    let spaced = app
        .job(" \"8e03978e-40d5-43e8-bc93-6894a57f9324\" ", "input")
        .await;
    assert_eq!(quoted.status, 201);
    assert_eq!((bare.status, &bare.body), (201, &quoted.body));
    assert_eq!((spaced.status, &spaced.body), (201, &quoted.body));
    assert!(!quoted.replayed() && bare.replayed() && spaced.replayed());
    let conflict = app
        .job("8e03978e-40d5-43e8-bc93-6894a57f9324", "other input")
        .await;
    let body = conflict.assert_problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body["existing_task_id"], quoted.task_id().to_string());
}

#[tokio::test]
async fn a_replay_of_a_completed_task_carries_its_saved_response() {
    let app = App::start().await;
    let first = app.job("\"job-1\"", "render report 7").await;
    let id = first.task_id();

    let worker = ClaimRequest::new("worker-1", Duration::from_secs(30));
    let Claim::Acquired(lease) = app.store.claim(id, worker).await.unwrap() else {
        panic!("a fresh task is available");
    };
    let running = app.job("\"job-1\"", "render report 7").await;
    assert_eq!(running.status, 201);
    assert!(running.replayed());
    assert_eq!(
        running.body,
        format!(r#"{{"id":"{id}","status":"running"}}"#).into_bytes()
    );

    assert!(
        app.store
            .complete(lease, Response::from("report 7: 3 pages"))
            .await
            .unwrap()
            .is_accepted()
    );
    let done = app.job("\"job-1\"", "render report 7").await;
    assert_eq!(done.status, 201);
    assert!(done.replayed());
    assert_eq!(
        done.body,
        format!(r#"{{"id":"{id}","status":"completed","response":"report 7: 3 pages"}}"#).into_bytes()
    );
    let again = app.job("8e-not-quoted-but-other-key", "render report 7").await;
    assert_eq!(again.status, 201, "another key is another task");
    let replay = app.job("job-1", "render report 7").await;
    assert_eq!((replay.status, &replay.body), (201, &done.body), "byte-identical");

    // The GET view reads the same body shape.
    let view = Reply::read(app.client.get(format!("{}/jobs/{id}", app.base))).await;
    assert_eq!((view.status, &view.body), (200, &done.body));
}

#[tokio::test]
async fn a_binary_saved_response_is_base64() {
    let app = App::start().await;
    let id = app.job("\"bin\"", "input").await.task_id();
    let worker = ClaimRequest::new("worker-1", Duration::from_secs(30));
    let Claim::Acquired(lease) = app.store.claim(id, worker).await.unwrap() else {
        panic!("a fresh task is available");
    };
    let saved = Response::new(vec![0xff, 0xfe, 0x00]);
    assert!(app.store.complete(lease, saved).await.unwrap().is_accepted());
    let replay = app.job("\"bin\"", "input").await;
    let body: TaskBody = serde_json::from_slice(&replay.body).unwrap();
    assert_eq!(body.status, "completed");
    assert_eq!(body.response, None);
    assert_eq!(body.response_base64.as_deref(), Some("//4A"));
}

#[tokio::test]
async fn not_found_and_storage_errors_are_problems_that_leak_nothing() {
    let app = App::start().await;
    let missing = Reply::read(app.client.get(format!("{}/jobs/{}", app.base, TaskId::new()))).await;
    missing.assert_problem(404, "/problems/not-found");

    let down = app
        .post("/broken", &[HeaderValue::from_static("\"k\"")], "")
        .await;
    down.assert_problem(503, "/problems/unavailable");
    let text = String::from_utf8(down.body).unwrap();
    for secret in ["hunter2", "10.0.0.5", "password", "storage"] {
        assert!(!text.contains(secret), "{text}");
    }
    // The extractor runs first: no key is still a 400.
    app.post("/broken", &[], "")
        .await
        .assert_problem(400, "/problems/idempotency-key-missing");
}

#[tokio::test]
async fn problem_types_can_live_under_the_applications_own_base() {
    let app = App::start().await;
    app.post("/custom/jobs", &[], "x")
        .await
        .assert_problem(400, "https://api.example.com/problems/idempotency-key-missing");
    app.post("/custom/jobs", &[HeaderValue::from_static("a b")], "x")
        .await
        .assert_problem(400, "https://api.example.com/problems/idempotency-key-malformed");
    let key = [HeaderValue::from_static("\"c1\"")];
    assert_eq!(app.post("/custom/jobs", &key, "x").await.status, 201);
    assert_eq!(app.post("/custom/jobs", &key, "x").await.status, 201);
    app.post("/custom/jobs", &key, "y")
        .await
        .assert_problem(422, "https://api.example.com/problems/idempotency-key-reused");
}

#[tokio::test]
async fn an_invalid_submission_is_a_400_problem_and_does_not_consume_the_key() {
    // The header is fine; the payload breaks the store's own limit.
    let app = App::start().await;
    let huge = "x".repeat(taskfence::limits::MAX_PAYLOAD_LEN + 1);
    let reply = app.job("\"big\"", &huge).await;
    let body = reply.assert_problem(400, "/problems/invalid-request");
    assert!(body["detail"].as_str().unwrap().contains("payload"), "{body}");
    assert_eq!(
        app.job("\"big\"", "small").await.status,
        201,
        "nothing was written"
    );
}

#[tokio::test]
async fn an_optional_key_deduplicates_when_sent_and_is_still_checked() {
    let app = App::start().await;
    for _ in 0..2 {
        let plain = app.post("/optional", &[], "x").await;
        assert_eq!(
            (plain.status, plain.body.as_slice()),
            (202, &b"not deduplicated"[..])
        );
    }
    let key = [HeaderValue::from_static("\"opt-1\"")];
    let first = app.post("/optional", &key, "x").await;
    let replay = app.post("/optional", &key, "x").await;
    assert_eq!((first.status, first.replayed()), (201, false));
    assert_eq!(
        (replay.status, replay.replayed(), &replay.body),
        (201, true, &first.body)
    );
    // A key that is there but malformed is a 400, not silently ignored.
    app.post("/optional", &[HeaderValue::from_static("a b")], "x")
        .await
        .assert_problem(400, "/problems/idempotency-key-malformed");
    let two = [HeaderValue::from_static("a"), HeaderValue::from_static("b")];
    app.post("/optional", &two, "x")
        .await
        .assert_problem(400, "/problems/idempotency-key-malformed");
}

#[tokio::test]
async fn json_reserialized_on_retry_is_the_same_request_and_a_changed_field_is_not() {
    let app = App::start().await;
    let send = |body: &'static str| {
        let request = app
            .client
            .post(format!("{}/transfers", app.base))
            .header("Idempotency-Key", "\"t-1\"")
            .header("Content-Type", "application/json")
            .body(body);
        Reply::read(request)
    };
    let first = send(r#"{"to":"ann","amount":10,"note":null}"#).await;
    assert_eq!(first.status, 201, "{}", String::from_utf8_lossy(&first.body));
    // Another key order, whitespace, `10.0` for `10`, an absent optional field: the same fields.
    let retry = send("{ \"amount\": 10.0,\n  \"to\": \"ann\" }").await;
    assert_eq!(
        (retry.status, retry.replayed(), &retry.body),
        (201, true, &first.body)
    );
    // A changed field is another request under the same key.
    let changed = send(r#"{"to":"ann","amount":11}"#).await;
    let body = changed.assert_problem(422, "/problems/idempotency-key-reused");
    assert_eq!(body["existing_task_id"], first.json()["id"]);
}

/// `TaskStatus`: a failed task shows its error and is given up; a completed
/// one shows no error, whatever its earlier attempts said.
#[tokio::test]
async fn task_status_shows_the_error_until_the_task_completes() {
    use taskfence::{Failure, RetryPolicy};
    use taskfence_axum::TaskStatus;

    let store = MemoryStore::new();
    let lease_for = Duration::from_secs(30);
    let submit = |key: &str, attempts: u32| {
        NewTask::new(RequestKey::new("u", "op", key), InputHash::of([key])).policy(
            RetryPolicy::default()
                .max_attempts(attempts)
                .initial_backoff(Duration::from_millis(1))
                .max_backoff(Duration::from_millis(1))
                .jitter(0.0),
        )
    };
    let failed = store.submit(submit("failed", 1)).await.unwrap().into_task();
    let Claim::Acquired(lease) = store
        .claim(failed.id, ClaimRequest::new("w", lease_for))
        .await
        .unwrap()
    else {
        panic!("claimable")
    };
    let failing = store
        .fail(lease, Failure::permanent("400 bad prompt"))
        .await
        .unwrap();
    assert!(failing.is_accepted());
    let status = TaskStatus::from(&store.get(failed.id).await.unwrap().unwrap());
    assert_eq!(
        (status.status.as_str(), status.attempts, status.max_attempts),
        ("failed", 1, 1)
    );
    assert!(
        status
            .error
            .as_deref()
            .is_some_and(|e| e.contains("400 bad prompt")),
        "{status:?}"
    );
    assert!(status.is_given_up());

    let done = store.submit(submit("done", 2)).await.unwrap().into_task();
    let Claim::Acquired(lease) = store
        .claim(done.id, ClaimRequest::new("w", lease_for))
        .await
        .unwrap()
    else {
        panic!("claimable")
    };
    assert!(
        store
            .fail(lease, Failure::retryable("503"))
            .await
            .unwrap()
            .is_accepted()
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let Claim::Acquired(lease) = store
        .claim(done.id, ClaimRequest::new("w", lease_for))
        .await
        .unwrap()
    else {
        panic!("claimable again past its 1 ms backoff")
    };
    assert!(store.complete(lease, "reply".into()).await.unwrap().is_accepted());
    let status = TaskStatus::from(&store.get(done.id).await.unwrap().unwrap());
    assert_eq!((status.status.as_str(), status.attempts), ("completed", 2));
    assert_eq!(status.error, None, "no error once completed");
    assert!(!status.is_given_up());
}
