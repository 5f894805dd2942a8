//! What the dashboard keeps from whoever can reach it: task data behind
//! sign-in, ages that cannot overflow the date arithmetic, no redirect
//! off-site, sessions that end, throttled sign-in, tokens that are secrets,
//! and the headers every page carries. Straight into the router, on the
//! embedded store.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use common::*;
use taskfence::testing::{Fixture, InspectFixture, MemoryFixture};
use taskfence_web::{ConfigError, Dashboard};

/// A failed task and a completed one whose payload, response, key and
/// error are each a recognisable secret.
async fn secrets(f: &MemoryFixture) -> (taskfence::Task, taskfence::Task) {
    let store = f.store();
    let failed = failed(&*store, "tenant-1", "key-secret-7f3a", "error-secret-c41d").await;
    let task = submit(
        &*store,
        "tenant-1",
        "key-secret-9b2e",
        taskfence::RetryPolicy::default(),
        b"payload-secret-5e8f",
    )
    .await;
    let lease = taskfence::testing::acquire(&*store, task.id, "worker-1").await;
    let completed = store
        .complete(lease, taskfence::Response::new(b"response-secret-0a6c".to_vec()))
        .await
        .unwrap()
        .accepted()
        .unwrap();
    (failed, completed)
}

const SECRETS: [&str; 5] = [
    "key-secret-7f3a",
    "error-secret-c41d",
    "key-secret-9b2e",
    "payload-secret-5e8f",
    "response-secret-0a6c",
];

/// The pages that show tasks, as a browser would read them.
async fn every_page(router: &Router, ids: [&taskfence::Task; 2], cookie: Option<&str>) -> String {
    let mut all = String::new();
    for url in [
        "/".to_owned(),
        "/tasks".to_owned(),
        "/tasks?status=failed".to_owned(),
        "/stranded?older_than=1s".to_owned(),
        format!("/tasks/{}", ids[0].id),
        format!("/tasks/{}", ids[1].id),
    ] {
        let answer = get(router, &url, cookie).await;
        assert_eq!(answer.status, StatusCode::OK, "{url}: {}", answer.body);
        all.push_str(&answer.body);
    }
    all
}

#[tokio::test]
async fn task_data_needs_sign_in_unless_reads_are_open() {
    let f = MemoryFixture::new();
    let (failed, completed) = secrets(&f).await;
    f.advance(Duration::from_secs(2)).await; // stranded after a second (the store's clock)
    let router: Router = dashboard(f.inspector())
        .stranded_after(Duration::from_secs(1))
        .router();
    // Not signed in: the pages answer, with ids and statuses, without the data.
    let anonymous = every_page(&router, [&failed, &completed], None).await;
    for secret in SECRETS {
        assert!(
            !anonymous.contains(secret),
            "{secret} shown to anyone: {anonymous}"
        );
    }
    assert!(anonymous.contains(&failed.id.to_string()) && anonymous.contains("hidden: sign in to see"));
    // Finding a task by its request key would tell whether the key exists.
    get(&router, "/find?q=tenant-1/chat.reply/key-secret-7f3a", None)
        .await
        .page(StatusCode::UNAUTHORIZED, "name=\"token\"");
    // Signed in: all of it.
    let (cookie, _) = sign_in(&router, "").await;
    let signed = every_page(&router, [&failed, &completed], Some(&cookie)).await;
    for secret in SECRETS {
        assert!(
            signed.contains(secret),
            "{secret} hidden from a signed-in operator"
        );
    }
    // No token at all: no one can sign in, so the data stays hidden (403 for a key lookup).
    let read_only: Router = Dashboard::new(f.inspector()).router();
    let page = get(&read_only, &format!("/tasks/{}", completed.id), None).await;
    page.page(StatusCode::OK, "hidden: sign in to see");
    assert!(!page.body.contains("payload-secret-5e8f"));
    get(&read_only, "/find?q=tenant-1/chat.reply/key-secret-7f3a", None)
        .await
        .page(StatusCode::FORBIDDEN, "task data");
    // Open reads, opted into by name: everyone sees it.
    let open: Router = Dashboard::new(f.inspector()).open_reads().router();
    let everyone = every_page(&open, [&failed, &completed], None).await;
    for secret in SECRETS {
        assert!(everyone.contains(secret), "{secret} hidden despite open reads");
    }
}

#[tokio::test]
async fn out_of_range_ages_are_400_not_a_panic() {
    let f = MemoryFixture::new();
    pending(&*f.store(), "t", "a").await;
    let router: Router = dashboard(f.inspector()).router();
    let (cookie, _) = sign_in(&router, "").await;
    for url in [
        "/tasks?older_than=100000000y",
        "/tasks?newer_than=100000000y",
        "/tasks?newer_than=101y",
        "/stranded?older_than=100000000y",
    ] {
        get(&router, url, Some(&cookie))
            .await
            .page(StatusCode::BAD_REQUEST, "out of range");
    }
    // The longest accepted age still works.
    get(&router, "/tasks?older_than=36500d", Some(&cookie))
        .await
        .page(StatusCode::OK, "No tasks match");
    assert_eq!(
        taskfence_web::age::parse_age("100000000y"),
        Err(taskfence_web::age::AgeError::TooLong {
            max: taskfence_web::age::MAX_AGE
        })
    );
}

#[tokio::test]
async fn sign_in_never_redirects_off_site() {
    let f = MemoryFixture::new();
    let router: Router = dashboard(f.inspector()).router();
    for next in [
        "/%09/evil.example",
        "/%0A/evil.example",
        "/%0D%0A/evil.example",
        "/%20/evil.example",
        "%09//evil.example",
        "//evil.example",
        "/%5Cevil.example",
        "https://evil.example",
        "/%00/evil.example",
    ] {
        let answer = send(
            &router,
            "POST",
            "/login",
            None,
            Some(&format!("token={TOKEN}&next={next}")),
        )
        .await;
        assert_eq!(answer.location(), "/", "next={next}");
        // The sign-in form carries no such `next` either.
        let form = get(&router, &format!("/login?next={next}"), None).await;
        form.page(StatusCode::OK, "name=\"next\" value=\"/\"");
    }
    let here = send(
        &router,
        "POST",
        "/login",
        None,
        Some(&format!("token={TOKEN}&next=/tasks%3Fstatus%3Dfailed")),
    )
    .await;
    assert_eq!(here.location(), "/tasks?status=failed");
}

#[tokio::test]
async fn each_sign_in_gets_its_own_session_and_logout_revokes_it() {
    let f = MemoryFixture::new();
    let router: Router = dashboard(f.inspector()).router();
    let (first, first_csrf) = sign_in(&router, "").await;
    let (second, second_csrf) = sign_in(&router, "").await;
    assert_ne!(first, second, "the same session value for two sign-ins");
    assert_ne!(first_csrf, second_csrf);
    let signed_in = |answer: &Answer| answer.body.contains("Sign out");
    assert!(signed_in(&get(&router, "/", Some(&first)).await));
    // The cookie says how long it lasts: the 8-hour default.
    let answer = send(
        &router,
        "POST",
        "/login",
        None,
        Some(&format!("token={TOKEN}&next=/")),
    )
    .await;
    let set = answer.headers["set-cookie"].to_str().unwrap();
    assert!(
        set.contains("Max-Age=28800") && set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    // Signing out revokes the session: a copy of the old cookie is refused.
    let out = send(
        &router,
        "POST",
        "/logout",
        Some(&first),
        Some(&format!("csrf={first_csrf}")),
    )
    .await;
    assert_eq!(out.location(), "/");
    assert!(
        !signed_in(&get(&router, "/", Some(&first)).await),
        "a revoked cookie still signs in"
    );
    let task = failed(&*f.store(), "t", "a", "boom").await;
    send(
        &router,
        "POST",
        &format!("/tasks/{}/cancel", task.id),
        Some(&first),
        Some(&format!("csrf={first_csrf}&reason=x")),
    )
    .await
    .page(StatusCode::UNAUTHORIZED, "action token");
    // The other sign-in is untouched.
    assert!(signed_in(&get(&router, "/", Some(&second)).await));
}

#[tokio::test]
async fn sessions_expire() {
    let f = MemoryFixture::new();
    let router: Router = dashboard(f.inspector())
        .session_lifetime(Duration::from_secs(1))
        .router();
    let answer = send(
        &router,
        "POST",
        "/login",
        None,
        Some(&format!("token={TOKEN}&next=/")),
    )
    .await;
    assert!(
        answer.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=1;")
    );
    let cookie = answer.session_cookie();
    assert!(get(&router, "/", Some(&cookie)).await.body.contains("Sign out"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = get(&router, "/", Some(&cookie)).await;
    assert!(
        !later.body.contains("Sign out"),
        "an expired session still signs in"
    );
}

#[tokio::test]
async fn over_tls_the_cookie_is_secure_and_host_prefixed() {
    let f = MemoryFixture::new();
    let app: Router = Router::new().nest("/ops", dashboard(f.inspector()).served_over_tls(true).router());
    let answer = send(
        &app,
        "POST",
        "/ops/login",
        None,
        Some(&format!("token={TOKEN}&next=/")),
    )
    .await;
    let set = answer.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(set.starts_with("__Host-taskfence_session="), "{set}");
    assert!(
        set.contains("; Secure") && set.contains("Path=/;") && !set.contains("Domain"),
        "{set}"
    );
    let cookie = answer.session_cookie();
    assert!(get(&app, "/ops", Some(&cookie)).await.body.contains("Sign out"));
    // The plain name is not read: a cookie set over HTTP cannot stand in.
    let value = cookie.split_once('=').unwrap().1;
    let plain = format!("taskfence_session={value}");
    assert!(!get(&app, "/ops", Some(&plain)).await.body.contains("Sign out"));
}

#[tokio::test]
async fn wrong_tokens_are_throttled_per_client_and_overall() {
    let f = MemoryFixture::new();
    let router: Router = dashboard(f.inspector()).router();
    let attacker: SocketAddr = "127.0.0.2:40000".parse().unwrap();
    let operator: SocketAddr = "127.0.0.3:40000".parse().unwrap();
    let login = |client: SocketAddr, token: &str| {
        let router = router.clone();
        let form = format!("token={token}&next=/");
        async move { send_from(&router, Some(client), "POST", "/login", None, Some(&form)).await }
    };
    let mut unauthorized = 0;
    let mut throttled = 0;
    for i in 0..200 {
        let answer = login(attacker, &format!("guess-{i:04}-abcdefghijkl")).await;
        match answer.status {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                throttled += 1;
                let wait: u64 = answer.headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=5).contains(&wait), "Retry-After: {wait}");
                answer.page(StatusCode::TOO_MANY_REQUESTS, "Too many wrong tokens");
            }
            other => panic!("{other}: {}", answer.body),
        }
    }
    assert_eq!(
        (unauthorized, throttled),
        (6, 194),
        "five free tries, then locked out"
    );
    // Locked out, even the right token is refused (not compared).
    let right = login(attacker, TOKEN).await;
    assert_eq!(right.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!right.headers.contains_key("set-cookie"));
    // Another client is not: the operator signs in.
    assert_eq!(login(operator, TOKEN).await.location(), "/");

    // Over all clients: a hundred failures in a minute close sign-in for everyone.
    let router: Router = dashboard(f.inspector()).router();
    for i in 0..100u32 {
        let client = SocketAddr::from(([10, 1, (i / 250) as u8, (i % 250) as u8 + 1], 40000));
        let form = format!("token=guess-{i:04}-abcdefghijkl&next=/");
        let answer = send_from(&router, Some(client), "POST", "/login", None, Some(&form)).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{i}");
    }
    let form = format!("token={TOKEN}&next=/");
    let closed = send_from(&router, Some(operator), "POST", "/login", None, Some(&form)).await;
    assert_eq!(closed.status, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = closed.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "Retry-After: {wait}");
}

#[test]
fn predictable_tokens_are_refused_at_configuration() {
    let f = MemoryFixture::new();
    for token in [
        "a".repeat(16),
        "ab".repeat(12),
        "abcdabcdabcdabcd".to_owned(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab".to_owned(),
    ] {
        let refused = Dashboard::new(f.inspector()).action_token(token.clone());
        assert!(
            matches!(refused, Err(ConfigError::TokenTooPredictable { .. })),
            "{token}: {refused:?}"
        );
    }
    assert!(matches!(
        Dashboard::new(f.inspector()).action_token("short"),
        Err(ConfigError::TokenTooShort { min: 16 })
    ));
    for token in [
        TOKEN,
        "0123456789abcdef",
        "kY3v9Qz1Lr8wXp2N",
        "a long random secret from the environment",
    ] {
        assert!(
            Dashboard::new(f.inspector()).action_token(token).is_ok(),
            "{token}"
        );
    }
}

#[tokio::test]
async fn pages_send_security_headers() {
    let f = MemoryFixture::new();
    let task = failed(&*f.store(), "t", "a", "boom").await;
    let router: Router = dashboard(f.inspector()).router();
    let (cookie, _) = sign_in(&router, "").await;
    for url in [
        "/".to_owned(),
        "/tasks".to_owned(),
        format!("/tasks/{}", task.id),
        format!("/tasks/{}/reopen", task.id),
        "/stranded".to_owned(),
        "/login".to_owned(),
        "/no/such/page".to_owned(),
        "/tasks?older_than=soon".to_owned(),
    ] {
        let answer = get(&router, &url, Some(&cookie)).await;
        let header = |name: &str| {
            answer
                .headers
                .get(name)
                .unwrap_or_else(|| panic!("{url}: no {name}"))
                .to_str()
                .unwrap()
                .to_owned()
        };
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(directive), "{url}: {csp}");
        }
        assert_eq!(header("x-frame-options"), "DENY", "{url}");
        assert_eq!(header("cache-control"), "no-store", "{url}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{url}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{url}");
        // Nothing inline that the policy would block.
        assert!(
            !answer.body.contains(" style=\"") && !answer.body.contains("<script>"),
            "{url}"
        );
    }
    // The assets stay cacheable.
    let page = get(&router, "/", None).await;
    let css = page
        .body
        .split("href=\"/assets/")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let asset = get(&router, &format!("/assets/{css}"), None).await;
    assert!(
        asset.headers["cache-control"]
            .to_str()
            .unwrap()
            .contains("max-age")
    );
    assert_eq!(asset.headers["x-content-type-options"], "nosniff");
}
