//! TLS is asked for in `DATABASE_URL` (`sslmode=…`), and the pool `db::connect`
//! builds honours it with rustls: encrypted when required, never a silent
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
    let plain = chat_api::db::connect(&url, None, 1).await.expect("connect");
    let server_offers_tls: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&plain)
        .await
        .expect("SHOW ssl");

    let required = chat_api::db::connect(&with_sslmode(&url, "require"), None, 1).await;
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
