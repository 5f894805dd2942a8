//! TLS is asked for in `DATABASE_URL` (`sslmode=…`), and the pool the binary
//! builds (`taskfence::config::connect_pool`) honours it with rustls: encrypted when required, never a silent
//! fall-back to plain text.

use sqlx::postgres::PgConnectOptions;
use taskfence_test_support::database_url;

/// `url` with `sslmode=<mode>` added.
fn with_sslmode(url: &str, mode: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode={mode}")
}

#[tokio::test]
async fn sslmode_require_connects_encrypted_or_not_at_all() {
    let url = database_url().await;
    let connect =
        |url: String| async move { taskfence::config::connect_pool(&url, None, 1, "chat-api").await };
    let plain = connect(url.clone()).await.expect("connect");
    let server_offers_tls: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&plain)
        .await
        .expect("SHOW ssl");

    let required = connect(with_sslmode(&url, "require")).await;
    if server_offers_tls == "on" {
        let pool = required.expect("sslmode=require connects when the server offers TLS");
        let encrypted: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("read pg_stat_ssl");
        assert!(encrypted, "the session is encrypted");
    } else {
        assert!(
            required.is_err(),
            "without TLS on the server, sslmode=require must refuse to connect"
        );
    }
}

#[test]
fn the_rds_style_url_parses() {
    let options: PgConnectOptions =
        "postgres://app@db.example.com/chat?sslmode=verify-full&sslrootcert=/etc/ssl/rds-global-bundle.pem"
            .parse()
            .expect("verify-full with a root certificate is a valid URL");
    assert_eq!(options.get_host(), "db.example.com");
    assert!(matches!(
        options.get_ssl_mode(),
        sqlx::postgres::PgSslMode::VerifyFull
    ));
}
