//! Every route and action over HTTP, straight into the router: the pages,
//! the statuses of bad input, the token and CSRF checks, a store that is
//! down; on the embedded store, then on PostgreSQL and DynamoDB (moto).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::http::StatusCode;
use common::*;
use taskfence::testing::{Fixture, InspectFixture, MemoryFixture};
use taskfence::{Status, TaskId};
use taskfence_web::{Dashboard, Redispatch};

fn memory() -> (MemoryFixture, Router) {
    let f = MemoryFixture::new();
    let router = dashboard(f.inspector()).router();
    (f, router)
}

#[tokio::test]
async fn the_overview_counts_and_lists_failures() {
    let (f, router) = memory();
    let store = f.store();
    failed(&*store, "tenant-1", "a", "provider said 529").await;
    completed(&*store, "tenant-2", "b", b"hi").await;
    pending(&*store, "tenant-2", "c").await;
    // Errors are task data: shown to a signed-in operator.
    let (cookie, _) = sign_in(&router, "").await;
    let page = get(&router, "/", Some(&cookie)).await;
    page.page(StatusCode::OK, "provider said 529")
        .page(StatusCode::OK, r#"data-status="failed">1<"#)
        .page(StatusCode::OK, r#"data-status="pending">1<"#)
        .page(StatusCode::OK, r#"http-equiv="refresh" content="10""#)
        .page(StatusCode::OK, "tenant-2");
    // One scope's counts.
    let scoped = get(&router, "/?scope=tenant-2", None).await;
    scoped.page(StatusCode::OK, r#"data-status="completed">1<"#);
    assert!(
        scoped.body.contains(r#"data-status="failed">0<"#),
        "{}",
        scoped.body
    );
    get(&router, "/?scope=%00", None)
        .await
        .page(StatusCode::BAD_REQUEST, "scope");
}

#[tokio::test]
async fn the_limits_page_shows_buckets_and_a_keys_slots() {
    use taskfence::throttle::{ConcurrencyKey, RateBucket};

    let (f, router) = memory();
    let store = f.store();
    get(&router, "/limits", None)
        .await
        .page(StatusCode::OK, "No rate bucket is defined");
    store
        .define_bucket(RateBucket::per_minute("openai-key-1", 500).burst(50))
        .await
        .unwrap();
    let keyed =
        |key: &str| taskfence::testing::new_task(key).concurrency(ConcurrencyKey::new("conversation-7", 1));
    let first = store.submit(keyed("m1")).await.unwrap().into_task();
    store.submit(keyed("m2")).await.unwrap();
    taskfence::testing::acquire(&*store, first.id, "w").await;

    get(&router, "/limits?key=conversation-7", None)
        .await
        .page(StatusCode::OK, r#"data-available="openai-key-1">50<"#)
        .page(StatusCode::OK, "500 per 1m")
        .page(StatusCode::OK, "1 running, 1 waiting")
        .page(StatusCode::OK, &format!("/tasks/{}", first.id));
    let too_long = "k".repeat(taskfence::throttle::MAX_NAME_LEN + 1);
    get(&router, &format!("/limits?key={too_long}"), None)
        .await
        .page(StatusCode::BAD_REQUEST, "key");
}

#[tokio::test]
async fn the_task_list_filters_and_pages() {
    let (f, router) = memory();
    let store = f.store();
    let mut ids = Vec::new();
    for k in ["a", "b", "c", "d", "e"] {
        ids.push(pending(&*store, "t", k).await.id);
    }
    let dead = failed(&*store, "t", "f", "boom").await;
    let first = get(&router, "/tasks?status=pending&limit=2", None).await;
    first
        .page(StatusCode::OK, &ids[4].to_string())
        .page(StatusCode::OK, &ids[3].to_string());
    assert!(!first.body.contains(&dead.id.to_string()));
    let next = first
        .body
        .split("id=\"next-page\" href=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let next = next.replace("&amp;", "&");
    assert!(
        next.contains("status=pending") && next.contains("after="),
        "{next}"
    );
    let second = get(&router, &next, None).await;
    second
        .page(StatusCode::OK, &ids[2].to_string())
        .page(StatusCode::OK, &ids[1].to_string());
    let oldest = get(&router, "/tasks?order=oldest&limit=1", None).await;
    oldest.page(StatusCode::OK, &ids[0].to_string());
    get(
        &router,
        "/tasks?status=failed&scope=t&operation=chat.reply&newer_than=1h",
        None,
    )
    .await
    .page(StatusCode::OK, &dead.id.to_string());
    get(&router, "/tasks?older_than=1h", None)
        .await
        .page(StatusCode::OK, "No tasks match");
    for (query, says) in [
        ("status=done", "not a status"),
        ("order=sideways", "not an order"),
        ("limit=0", "limit"),
        ("limit=many", "limit"),
        ("after=not-a-cursor", "not a cursor"),
        ("older_than=5%20fortnights", "not a duration"),
        ("newer_than=0s", "positive"),
        ("limit=%ZZ", "limit"),
    ] {
        get(&router, &format!("/tasks?{query}"), None)
            .await
            .page(StatusCode::BAD_REQUEST, says);
    }
}

#[tokio::test]
async fn find_by_id_or_request_key() {
    let (f, router) = memory();
    let task = failed(&*f.store(), "tenant-1", "key/with/slashes", "boom").await;
    let by_id = get(&router, &format!("/find?q={}", task.id), None).await;
    assert_eq!(by_id.location(), format!("/tasks/{}", task.id));
    // A request key is task data: finding by one needs sign-in.
    get(
        &router,
        "/find?q=tenant-1%2Fchat.reply%2Fkey%2Fwith%2Fslashes",
        None,
    )
    .await
    .page(StatusCode::UNAUTHORIZED, "name=\"token\"");
    let (cookie, _) = sign_in(&router, "").await;
    let by_key = get(
        &router,
        "/find?q=tenant-1%2Fchat.reply%2Fkey%2Fwith%2Fslashes",
        Some(&cookie),
    )
    .await;
    assert_eq!(by_key.location(), format!("/tasks/{}", task.id));
    get(&router, &format!("/find?q={}", TaskId::new()), None)
        .await
        .page(StatusCode::NOT_FOUND, "No task");
    get(&router, "/find?q=tenant-1/chat.reply/other", Some(&cookie))
        .await
        .page(StatusCode::NOT_FOUND, "No task");
    get(&router, "/find?q=nonsense", None)
        .await
        .page(StatusCode::BAD_REQUEST, "neither a task id");
    get(&router, "/find?q=a//k", Some(&cookie))
        .await
        .page(StatusCode::BAD_REQUEST, "Not a request key");
    get(&router, "/find?q=", None)
        .await
        .page(StatusCode::BAD_REQUEST, "Type a task id");
}

#[tokio::test]
async fn the_task_page_draws_the_story() {
    let (f, router) = memory();
    let store = f.store();
    let task = failed(&*store, "tenant-1", "a", "provider said 529").await;
    let (cookie, _) = sign_in(&router, "").await;
    let cookie = Some(cookie.as_str());
    let page = get(&router, &format!("/tasks/{}", task.id), cookie).await;
    page.page(StatusCode::OK, "id=\"timeline\"")
        .page(StatusCode::OK, "Submitted")
        .page(StatusCode::OK, "Claimed by")
        .page(StatusCode::OK, "worker-1")
        .page(StatusCode::OK, "failed (retryable)")
        .page(StatusCode::OK, "Failed terminally")
        .page(StatusCode::OK, "svg class=\"strip\"")
        .page(StatusCode::OK, "0</strong> of 1") // the budget left
        .page(StatusCode::OK, "prompt"); // the payload, as text
    let text = completed(&*store, "t", "b", "Привет, <world>".as_bytes()).await;
    get(&router, &format!("/tasks/{}", text.id), cookie)
        .await
        .page(StatusCode::OK, "UTF-8 text")
        .page(StatusCode::OK, "Привет, &lt;world&gt;");
    let binary = completed(&*store, "t", "c", &[0, 159, 146, 150]).await;
    get(&router, &format!("/tasks/{}", binary.id), cookie)
        .await
        .page(StatusCode::OK, "not UTF-8: hex")
        .page(StatusCode::OK, "00 9f 92 96");
}

#[tokio::test]
async fn the_task_page_lists_the_effect_journal() {
    use taskfence::effect::EffectOutcome;
    let (f, router) = memory();
    let store = f.store();
    let task = store
        .submit(taskfence::testing::new_task("effects"))
        .await
        .unwrap()
        .into_task();
    let lease = taskfence::testing::acquire(&*store, task.id, "worker-1").await;
    for name in ["notify-user", "charge-card"] {
        assert!(store.begin_effect(&lease, name).await.unwrap().is_accepted());
    }
    let done = store.finish_effect(&lease, "notify-user", EffectOutcome::done("delivery-7"));
    assert!(done.await.unwrap().is_accepted());
    let (cookie, _) = sign_in(&router, "").await;
    get(&router, &format!("/tasks/{}", task.id), Some(&cookie))
        .await
        .page(StatusCode::OK, "id=\"effects\"")
        .page(StatusCode::OK, &format!("tf:{}:notify-user", task.id))
        .page(StatusCode::OK, "delivery-7")
        .page(StatusCode::OK, "charge-card")
        .page(StatusCode::OK, "no outcome recorded")
        .page(StatusCode::OK, "effect notify-user done");
}

#[tokio::test]
async fn unknown_and_malformed_ids_are_404_and_400() {
    let (f, router) = memory();
    let task = failed(&*f.store(), "t", "a", "boom").await;
    let (cookie, csrf) = sign_in(&router, "").await;
    let unknown = TaskId::new();
    get(&router, &format!("/tasks/{unknown}"), None)
        .await
        .page(StatusCode::NOT_FOUND, &unknown.to_string());
    get(&router, &format!("/tasks/{unknown}/reopen"), Some(&cookie))
        .await
        .page(StatusCode::NOT_FOUND, "No task");
    get(&router, &format!("/tasks/{unknown}/cancel"), Some(&cookie))
        .await
        .page(StatusCode::NOT_FOUND, "No task");
    let form = format!("csrf={csrf}&by=alice&reason=why");
    send(
        &router,
        "POST",
        &format!("/tasks/{unknown}/reopen"),
        Some(&cookie),
        Some(&form),
    )
    .await
    .page(StatusCode::NOT_FOUND, "No task");
    send(
        &router,
        "POST",
        &format!("/tasks/{unknown}/cancel"),
        Some(&cookie),
        Some(&form),
    )
    .await
    .page(StatusCode::NOT_FOUND, "No task");
    get(&router, "/tasks/not-a-uuid", None)
        .await
        .page(StatusCode::BAD_REQUEST, "not a task id");
    get(&router, "/tasks/not-a-uuid/reopen", Some(&cookie))
        .await
        .page(StatusCode::BAD_REQUEST, "not a task id");
    get(&router, "/no/such/page", None)
        .await
        .page(StatusCode::NOT_FOUND, "no page at /no/such/page");
    get(&router, "/assets/evil.js", None)
        .await
        .page(StatusCode::NOT_FOUND, "No asset");
    // Bad form fields: nothing changes.
    let url = format!("/tasks/{}/reopen", task.id);
    for (form, says) in [
        (format!("csrf={csrf}&by=alice&reason=%20"), "Say why"),
        (format!("csrf={csrf}&by=&reason=why"), "Say who"),
        (
            format!("csrf={csrf}&by=alice&reason=why&max_attempts=0"),
            "fresh budget",
        ),
        (
            format!("csrf={csrf}&by=alice&reason=why&max_attempts=x"),
            "fresh budget",
        ),
    ] {
        send(&router, "POST", &url, Some(&cookie), Some(&form))
            .await
            .page(StatusCode::BAD_REQUEST, says);
    }
    assert_eq!(
        f.store().get(task.id).await.unwrap().unwrap().status,
        Status::Failed
    );
}

#[tokio::test]
async fn actions_need_the_token_and_the_csrf_value() {
    let (f, router) = memory();
    let task = failed(&*f.store(), "t", "a", "boom").await;
    let url = format!("/tasks/{}/reopen", task.id);
    let (cookie, csrf) = sign_in(&router, "").await;
    let form = |csrf: &str| format!("csrf={csrf}&by=alice&reason=fixed");
    // No session: 401 with a sign-in form that returns here.
    get(&router, &url, None)
        .await
        .page(StatusCode::UNAUTHORIZED, "name=\"token\"")
        .page(StatusCode::UNAUTHORIZED, &format!("value=\"{url}\""));
    send(&router, "POST", &url, None, Some(&form(&csrf)))
        .await
        .page(StatusCode::UNAUTHORIZED, "action token");
    // A forged session: 401.
    let forged_cookie = format!("taskfence_session={}", "0".repeat(64));
    send(&router, "POST", &url, Some(&forged_cookie), Some(&form(&csrf)))
        .await
        .page(StatusCode::UNAUTHORIZED, "action token");
    // A wrong token at sign-in: 401, no cookie.
    let wrong = send(
        &router,
        "POST",
        "/login",
        None,
        Some("token=guess-guess-guess-guess&next=/"),
    )
    .await;
    wrong.page(StatusCode::UNAUTHORIZED, "not the action token");
    assert!(!wrong.headers.contains_key("set-cookie"));
    // Signed in, but the CSRF value missing or forged: 403.
    send(
        &router,
        "POST",
        &url,
        Some(&cookie),
        Some("by=alice&reason=fixed"),
    )
    .await
    .page(StatusCode::FORBIDDEN, "CSRF");
    send(&router, "POST", &url, Some(&cookie), Some(&form(&"f".repeat(64))))
        .await
        .page(StatusCode::FORBIDDEN, "CSRF");
    send(&router, "POST", "/logout", Some(&cookie), Some("csrf=nope"))
        .await
        .page(StatusCode::FORBIDDEN, "CSRF");
    assert_eq!(
        f.store().get(task.id).await.unwrap().unwrap().status,
        Status::Failed
    );
    // An open redirect is not one.
    let away = send(
        &router,
        "POST",
        "/login",
        None,
        Some(&format!("token={TOKEN}&next=//evil.example")),
    )
    .await;
    assert_eq!(away.location(), "/");
    // Signing out.
    let out = send(
        &router,
        "POST",
        "/logout",
        Some(&cookie),
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(out.location(), "/");
    assert!(out.headers["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
}

#[tokio::test]
async fn a_read_only_dashboard_refuses_every_action() {
    let f = MemoryFixture::new();
    let task = failed(&*f.store(), "t", "a", "boom").await;
    let router: Router = Dashboard::new(f.inspector()).router();
    let page = get(&router, &format!("/tasks/{}", task.id), None).await;
    page.page(StatusCode::OK, "read-only");
    assert!(!page.body.contains("id=\"reopen\""));
    for url in [
        format!("/tasks/{}/reopen", task.id),
        format!("/tasks/{}/cancel", task.id),
        "/login".into(),
    ] {
        get(&router, &url, None)
            .await
            .page(StatusCode::FORBIDDEN, "read-only");
        send(&router, "POST", &url, None, Some("csrf=x&by=a&reason=b&token=x"))
            .await
            .page(StatusCode::FORBIDDEN, "read-only");
    }
    assert_eq!(
        f.store().get(task.id).await.unwrap().unwrap().status,
        Status::Failed
    );
}

#[tokio::test]
async fn reopen_confirms_then_gives_a_new_version() {
    let (f, router) = memory();
    let store = f.store();
    let task = failed(&*store, "t", "a", "boom").await;
    let (cookie, csrf) = sign_in(&router, "").await;
    let page = get(&router, &format!("/tasks/{}", task.id), Some(&cookie)).await;
    page.page(StatusCode::OK, "id=\"reopen\"");
    let confirm = get(&router, &format!("/tasks/{}/reopen", task.id), Some(&cookie)).await;
    confirm
        .page(StatusCode::OK, "Reopen this task?")
        .page(StatusCode::OK, "version 2");
    let done = send(
        &router,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!(
            "csrf={}&by=alice&reason=provider+fixed&max_attempts=3",
            confirm.csrf()
        )),
    )
    .await;
    assert_eq!(done.location(), format!("/tasks/{}?done=reopened", task.id));
    let reopened = store.get(task.id).await.unwrap().unwrap();
    assert_eq!((reopened.status, reopened.attempts_left()), (Status::Pending, 3));
    get(&router, done.location(), Some(&cookie))
        .await
        .page(StatusCode::OK, "id=\"flash\"")
        .page(StatusCode::OK, "Reopened (#1) by alice")
        .page(StatusCode::OK, "provider fixed");
    // Again: the store refuses, with its typed reason.
    send(
        &router,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&by=alice&reason=again")),
    )
    .await
    .page(StatusCode::CONFLICT, "not_terminal")
    .page(
        StatusCode::CONFLICT,
        "only a failed or cancelled task can be reopened",
    );
}

#[tokio::test]
async fn cancel_confirms_then_cancels() {
    let (f, router) = memory();
    let store = f.store();
    let task = pending(&*store, "t", "a").await;
    let done_task = completed(&*store, "t", "b", b"saved").await;
    let (cookie, csrf) = sign_in(&router, "").await;
    get(&router, &format!("/tasks/{}/cancel", task.id), Some(&cookie))
        .await
        .page(StatusCode::OK, "Cancel this task?");
    let done = send(
        &router,
        "POST",
        &format!("/tasks/{}/cancel", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&reason=user+left")),
    )
    .await;
    assert_eq!(done.location(), format!("/tasks/{}?done=cancelled", task.id));
    let cancelled = store.get(task.id).await.unwrap().unwrap();
    assert_eq!(
        (cancelled.status, cancelled.last_error.as_deref()),
        (Status::Cancelled, Some("user left"))
    );
    send(
        &router,
        "POST",
        &format!("/tasks/{}/cancel", done_task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&reason=too+late")),
    )
    .await
    .page(StatusCode::CONFLICT, "already_completed");
    send(
        &router,
        "POST",
        &format!("/tasks/{}/cancel", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}")),
    )
    .await
    .page(StatusCode::BAD_REQUEST, "Say why");
}

/// A redispatcher that remembers what it was asked.
#[derive(Default)]
struct Recorder(Mutex<Vec<TaskId>>);

#[async_trait]
impl Redispatch for Recorder {
    async fn redispatch(&self, ids: &[TaskId]) -> taskfence::Result<u64> {
        self.0.lock().unwrap().extend_from_slice(ids);
        Ok(ids.len() as u64)
    }
}

#[tokio::test]
async fn stranded_tasks_and_redispatch() {
    let f = MemoryFixture::new();
    let store = f.store();
    let lost = pending(&*store, "t", "lost").await;
    f.advance(Duration::from_secs(20 * 60)).await;
    let recent = pending(&*store, "t", "recent").await;
    // Without a redispatcher: the ids to publish, no action.
    let plain: Router = dashboard(f.inspector()).router();
    let page = get(&plain, "/stranded", None).await;
    page.page(StatusCode::OK, &lost.id.to_string())
        .page(StatusCode::OK, "id=\"stranded-ids\"");
    assert!(!page.body.contains(&recent.id.to_string()));
    get(&plain, "/redispatch?older_than=15m", None)
        .await
        .page(StatusCode::NOT_FOUND, "no redispatch");
    get(&plain, "/stranded?older_than=soon", None)
        .await
        .page(StatusCode::BAD_REQUEST, "not a duration");
    get(&plain, "/stranded?limit=0", None)
        .await
        .page(StatusCode::BAD_REQUEST, "limit");
    get(&plain, "/stranded?older_than=1h", None)
        .await
        .page(StatusCode::OK, "id=\"no-stranded\"");
    get(&plain, "/", None)
        .await
        .page(StatusCode::OK, "id=\"stranded-count\">1<");

    let recorder = Arc::new(Recorder::default());
    let router: Router = dashboard(f.inspector()).redispatch(recorder.clone()).router();
    let (cookie, csrf) = sign_in(&router, "").await;
    get(&router, "/stranded", Some(&cookie))
        .await
        .page(StatusCode::OK, "id=\"redispatch-all\"");
    let confirm = get(&router, "/redispatch?older_than=15m&limit=100", Some(&cookie)).await;
    confirm.page(StatusCode::OK, &lost.id.to_string());
    let done = send(
        &router,
        "POST",
        "/redispatch",
        Some(&cookie),
        Some(&format!("csrf={csrf}&ids={}&back=%2Fstranded", lost.id)),
    )
    .await;
    assert_eq!(done.location(), "/stranded?redispatched=1");
    assert_eq!(*recorder.0.lock().unwrap(), vec![lost.id]);
    get(&router, done.location(), Some(&cookie))
        .await
        .page(StatusCode::OK, "Handed off 1 task(s) again");
    // One task, from its page.
    get(&router, &format!("/tasks/{}", recent.id), Some(&cookie))
        .await
        .page(StatusCode::OK, "id=\"redispatch\"");
    get(&router, &format!("/redispatch?id={}", recent.id), Some(&cookie))
        .await
        .page(StatusCode::OK, "Hand 1 task(s) off again?");
    let one = send(
        &router,
        "POST",
        "/redispatch",
        Some(&cookie),
        Some(&format!(
            "csrf={csrf}&ids={}&back=/tasks/{}",
            recent.id, recent.id
        )),
    )
    .await;
    assert_eq!(one.location(), format!("/tasks/{}?done=redispatched", recent.id));
    for (form, status, says) in [
        (
            format!("csrf={csrf}&ids=nope"),
            StatusCode::BAD_REQUEST,
            "not a task id",
        ),
        (
            format!("csrf={csrf}&ids="),
            StatusCode::BAD_REQUEST,
            "No task ids",
        ),
        (format!("ids={}", lost.id), StatusCode::FORBIDDEN, "CSRF"),
    ] {
        send(&router, "POST", "/redispatch", Some(&cookie), Some(&form))
            .await
            .page(status, says);
    }
    send(
        &router,
        "POST",
        "/redispatch",
        None,
        Some(&format!("csrf={csrf}&ids={}", lost.id)),
    )
    .await
    .page(StatusCode::UNAUTHORIZED, "action token");
    assert_eq!(recorder.0.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn mounted_under_a_prefix_links_follow_it() {
    let f = MemoryFixture::new();
    let task = failed(&*f.store(), "t", "a", "boom").await;
    let app: Router = Router::new().nest("/ops", dashboard(f.inspector()).router());
    let page = get(&app, "/ops", None).await;
    page.page(StatusCode::OK, "href=\"/ops/tasks\"")
        .page(StatusCode::OK, "href=\"/ops/assets/style-");
    get(&app, "/ops?scope=t", None)
        .await
        .page(StatusCode::OK, "href=\"/ops/stranded\"");
    get(&app, "/ops/nothing", None)
        .await
        .page(StatusCode::NOT_FOUND, "href=\"/ops\"");
    let signed = send(
        &app,
        "POST",
        "/ops/login",
        None,
        Some(&format!("token={TOKEN}&next=/tasks")),
    )
    .await;
    assert_eq!(signed.location(), "/ops/tasks");
    assert!(
        signed.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Path=/ops;")
    );
    let (cookie, csrf) = sign_in(&app, "/ops").await;
    let done = send(
        &app,
        "POST",
        &format!("/ops/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&by=ops&reason=retry")),
    )
    .await;
    assert_eq!(done.location(), format!("/ops/tasks/{}?done=reopened", task.id));
    let css = page
        .body
        .split("href=\"/ops/assets/")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let asset = get(&app, &format!("/ops/assets/{css}"), None).await;
    assert_eq!(asset.status, StatusCode::OK);
    assert_eq!(asset.headers["content-type"], "text/css; charset=utf-8");
    assert!(asset.body.contains("ol.timeline"));
}

#[tokio::test]
async fn health_says_ok_while_the_store_answers() {
    let (_f, router) = memory();
    let health = get(&router, "/health", None).await;
    assert_eq!((health.status, health.body.as_str()), (StatusCode::OK, "ok\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_is_503() {
    // PostgreSQL on a port nothing listens on.
    let port = taskfence_test_support::free_port();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/none"))
        .unwrap();
    let router: Router = dashboard(Arc::new(taskfence::PgStore::new(pool))).router();
    let (cookie, csrf) = sign_in(&router, "").await;
    for url in [
        "/",
        "/tasks",
        "/stranded",
        &format!("/tasks/{}", TaskId::new()),
        "/find?q=a/b/c",
    ] {
        get(&router, url, Some(&cookie))
            .await
            .page(StatusCode::SERVICE_UNAVAILABLE, "did not answer");
    }
    send(
        &router,
        "POST",
        &format!("/tasks/{}/cancel", TaskId::new()),
        Some(&cookie),
        Some(&format!("csrf={csrf}&reason=x")),
    )
    .await
    .page(StatusCode::SERVICE_UNAVAILABLE, "did not answer");
    let health = get(&router, "/health", None).await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let f = taskfence_test_support::fixture().await;
    let store = f.store();
    let task = failed(&*store, "tenant-1", "a", "provider said 529").await;
    let lost = pending(&*store, "tenant-1", "lost").await;
    f.advance(Duration::from_secs(20 * 60)).await;
    let pg = Arc::new(f.pg_store().clone());
    let router: Router = dashboard(f.inspector()).redispatch(pg).router();
    let (cookie, csrf) = sign_in(&router, "").await;
    get(&router, "/", Some(&cookie))
        .await
        .page(StatusCode::OK, "provider said 529");
    get(&router, "/tasks?status=failed", None)
        .await
        .page(StatusCode::OK, &task.id.to_string());
    get(&router, &format!("/tasks/{}", task.id), None)
        .await
        .page(StatusCode::OK, "Handoff written");
    let done = send(
        &router,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&by=alice&reason=fixed")),
    )
    .await;
    get(&router, done.location(), None)
        .await
        .page(StatusCode::OK, "Reopened (#1) by alice");
    get(&router, "/stranded", Some(&cookie))
        .await
        .page(StatusCode::OK, &lost.id.to_string());
    let again = send(
        &router,
        "POST",
        "/redispatch",
        Some(&cookie),
        Some(&format!("csrf={csrf}&ids={}&back=/stranded", lost.id)),
    )
    .await;
    assert_eq!(again.location(), "/stranded?redispatched=1");
    let story = f.inspector().story(lost.id).await.unwrap().unwrap();
    assert_eq!(story.handoffs.len(), 2, "a new outbox row");
    get(&router, &format!("/tasks/{}", lost.id), None)
        .await
        .page(StatusCode::OK, "Handoff written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dynamodb() {
    let f = taskfence_test_support::dynamo::fixture().await;
    let store = f.store();
    let task = failed(&*store, "tenant-1", "a", "provider said 529").await;
    let lost = pending(&*store, "tenant-1", "lost").await;
    f.advance(Duration::from_secs(20 * 60)).await;
    let router: Router = dashboard(f.inspector()).router();
    let (cookie, csrf) = sign_in(&router, "").await;
    get(&router, "/", Some(&cookie))
        .await
        .page(StatusCode::OK, "provider said 529");
    get(&router, "/tasks?status=failed", None)
        .await
        .page(StatusCode::OK, &task.id.to_string());
    get(&router, "/find?q=tenant-1/chat.reply/a", Some(&cookie))
        .await
        .location();
    let done = send(
        &router,
        "POST",
        &format!("/tasks/{}/reopen", task.id),
        Some(&cookie),
        Some(&format!("csrf={csrf}&by=alice&reason=fixed")),
    )
    .await;
    get(&router, done.location(), None)
        .await
        .page(StatusCode::OK, "Reopened (#1) by alice");
    assert_eq!(store.get(task.id).await.unwrap().unwrap().status, Status::Pending);
    get(&router, "/stranded", Some(&cookie))
        .await
        .page(StatusCode::OK, &lost.id.to_string())
        .page(StatusCode::OK, "keeps no outbox");
}
