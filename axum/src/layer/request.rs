//! What the layer records of a request: the fingerprint its key is bound
//! to, and the payload an operator reads.

use axum::body::Bytes;
use http::header;
use http::request::Parts;
use taskfence::InputHash;

/// The fingerprint a key is bound to: method, path and query, and the body
/// (canonical when it is JSON). A hash: none of it is kept readable.
pub(super) fn fingerprint(parts: &Parts, body: &Bytes) -> InputHash {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let canonical = is_json(parts)
        .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
        .flatten()
        .and_then(|value| crate::fingerprint::canonical_json(&value).ok());
    let (kind, body) = match &canonical {
        Some(json) => ("json", json.as_slice()),
        None => ("bytes", body.as_ref()),
    };
    InputHash::of([
        b"http".as_slice(),
        parts.method.as_str().as_bytes(),
        target.as_bytes(),
        kind.as_bytes(),
        body,
    ])
}

/// The task's payload, for an operator's `taskfence show`: `METHOD /path`,
/// with the query string only when `with_query` (it may carry a token, and
/// the payload is kept for the key's whole retention).
pub(super) fn payload(parts: &Parts, with_query: bool) -> String {
    let target = if with_query {
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    } else {
        parts.uri.path()
    };
    format!("{} {target}", parts.method)
}

fn is_json(parts: &Parts) -> bool {
    let Some(media) = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
    else {
        return false;
    };
    let media = media.trim().to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn parts(content_type: &str, uri: &str) -> Parts {
        let (parts, ()) = Request::post(uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    #[test]
    fn json_bodies_are_fingerprinted_by_value_others_by_bytes() {
        let json = parts("application/json; charset=utf-8", "/orders");
        let a = fingerprint(&json, &Bytes::from_static(br#"{"a":1,"b":2}"#));
        let b = fingerprint(&json, &Bytes::from_static(b"{ \"b\": 2, \"a\": 1.0 }"));
        assert_eq!(a, b);
        assert_ne!(a, fingerprint(&json, &Bytes::from_static(br#"{"a":1,"b":3}"#)));
        assert_ne!(
            a,
            fingerprint(
                &parts("application/json", "/orders?x=1"),
                &Bytes::from_static(br#"{"a":1,"b":2}"#)
            )
        );
        let problem = parts("application/problem+json", "/orders");
        assert_eq!(
            fingerprint(&problem, &Bytes::from_static(br#"{"a":1}"#)),
            fingerprint(&problem, &Bytes::from_static(br#"{ "a" : 1 }"#))
        );
        let text = parts("text/plain", "/orders");
        assert_ne!(
            fingerprint(&text, &Bytes::from_static(br#"{"a":1}"#)),
            fingerprint(&text, &Bytes::from_static(br#"{ "a" : 1 }"#))
        );
    }

    #[test]
    fn the_payload_has_the_query_only_when_asked() {
        let request = parts("text/plain", "/orders?token=s3cret&x=1");
        assert_eq!(payload(&request, false), "POST /orders");
        assert_eq!(payload(&request, true), "POST /orders?token=s3cret&x=1");
        assert_eq!(payload(&parts("text/plain", "/"), false), "POST /");
    }
}
