//! The stylesheet and the script, compiled into the binary: the dashboard
//! needs no CDN and works on an isolated network. Their names carry a
//! version so a browser may cache them for good.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::response::{IntoResponse, Response};

use crate::error::PageError;

/// The stylesheet's name under `/assets/`.
pub(crate) const CSS_NAME: &str = concat!("style-", env!("CARGO_PKG_VERSION"), ".css");
/// The script's name under `/assets/`.
pub(crate) const JS_NAME: &str = concat!("app-", env!("CARGO_PKG_VERSION"), ".js");

const CSS: &str = include_str!("../assets/style.css");
const JS: &str = include_str!("../assets/app.js");

/// `GET /assets/{name}`.
pub(crate) async fn serve(Path(name): Path<String>) -> Result<Response, PageError> {
    let (body, kind) = match name.as_str() {
        n if n == CSS_NAME => (CSS, "text/css; charset=utf-8"),
        n if n == JS_NAME => (JS, "text/javascript; charset=utf-8"),
        _ => return Err(PageError::NotFound(format!("No asset named {name}."))),
    };
    Ok((
        [
            (CONTENT_TYPE, kind),
            (CACHE_CONTROL, "public, max-age=31536000, immutable"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response())
}
