//! [`serve`]: the HTTP server as one more task a service stops with its `Stop`.

use axum::Router;
use taskfence::runtime::Stop;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Serves `router` on `listener` in a task of its own until `stop` is
/// requested, then stops gracefully: no new connections, the requests in
/// progress finish (a long-poll watching the same `stop` answers at once).
/// A server failure is logged, as the task has no one to return it to.
///
/// Every service on taskfence runs its server beside its consumers under
/// one stop switch; the returned handle is awaited with theirs.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use axum::{Router, routing::get};
/// use taskfence::runtime::Stop;
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let stop = Stop::new();
/// let server = taskfence_axum::serve(listener, Router::new().route("/", get(|| async { "ok" })), stop.clone());
/// stop.drain();
/// server.await.expect("the server task ends");
/// # Ok(())
/// # }
/// ```
pub fn serve(listener: TcpListener, router: Router, stop: Stop) -> JoinHandle<()> {
    tokio::spawn(async move {
        let shutdown = async move { stop.requested().await };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%error, "HTTP server failed");
        }
    })
}
