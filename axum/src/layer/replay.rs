//! [`SavedResponse`]: a handler's response as the key's saved result, and
//! back as the replay every retry gets.

use axum::body::{Body, Bytes};
use axum::response::Response;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use taskfence::Task;

use crate::key::IDEMPOTENT_REPLAYED;

/// A response as the task's saved result: JSON, so an operator reads it
/// (`taskfence show`); the body as text when it is UTF-8, else base64. Only
/// the allow-listed headers are kept.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SavedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

impl SavedResponse {
    /// The saved form of a response: its status, the headers named in
    /// `keep`, its body.
    pub(super) fn of(
        status: StatusCode,
        headers: &http::HeaderMap,
        body: &Bytes,
        keep: &[HeaderName],
    ) -> Self {
        let headers = keep
            .iter()
            .flat_map(|name| {
                headers
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let (body, body_base64) = match std::str::from_utf8(body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(crate::b64::encode(body))),
        };
        Self {
            status: status.as_u16(),
            headers,
            body,
            body_base64,
        }
    }

    pub(super) fn encode(&self) -> taskfence::Response {
        // Strings and numbers only: serializing cannot fail.
        taskfence::Response::new(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    fn into_response(self) -> Option<Response> {
        let body = match (self.body, self.body_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => crate::b64::decode(&encoded)?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return None,
        };
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(
                HeaderName::try_from(name).ok()?,
                HeaderValue::try_from(value).ok()?,
            );
        }
        Some(response)
    }
}

/// The response saved on `task`, marked `Idempotent-Replayed: true`; `None`
/// when the task holds no response this layer wrote.
pub(super) fn replay(task: &Task) -> Option<Response> {
    let saved = task
        .response
        .as_ref()
        .and_then(|r| SavedResponse::decode(r.as_bytes()))?;
    let mut response = saved.into_response()?;
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    Some(response)
}

#[cfg(test)]
mod tests {
    use http::header;

    use super::*;

    #[test]
    fn a_saved_response_comes_back_with_its_kept_headers_only() {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("session=secret"));
        headers.append(header::ETAG, HeaderValue::from_static("\"v1\""));
        let body = Bytes::from_static(b"{\"id\":7}");
        let keep = [header::CONTENT_TYPE, header::ETAG];
        let saved = SavedResponse::of(StatusCode::CREATED, &headers, &body, &keep).encode();
        let text = saved.as_str().unwrap();
        assert!(!text.contains("secret"), "{text}");
        let back = SavedResponse::decode(saved.as_bytes())
            .unwrap()
            .into_response()
            .unwrap();
        assert_eq!(back.status(), StatusCode::CREATED);
        assert_eq!(back.headers()["content-type"], "application/json");
        assert_eq!(back.headers()["etag"], "\"v1\"");
        assert!(back.headers().get("set-cookie").is_none());
    }

    #[test]
    fn a_binary_body_is_saved_as_base64() {
        let body = Bytes::from_static(&[0xff, 0x00, 0xfe]);
        let saved = SavedResponse::of(StatusCode::OK, &http::HeaderMap::new(), &body, &[]).encode();
        assert_eq!(
            saved.as_str(),
            Some(r#"{"status":200,"headers":[],"body_base64":"/wD+"}"#)
        );
        let back = SavedResponse::decode(saved.as_bytes()).unwrap();
        assert_eq!(
            back.body_base64.as_deref().and_then(crate::b64::decode),
            Some(body.to_vec())
        );
    }
}
