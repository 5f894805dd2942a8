//! [`fingerprint`]: the [`InputHash`] of what a request *means* — the fields
//! the handler parsed — rather than of its bytes; [`canonical_json`]: the
//! bytes that hash is taken over.
//!
//! A client that retries may serialize its JSON again: another key order,
//! other whitespace, `1.0` where it sent `1`. A hash of the raw body would
//! call that retry a key reused with another body (a 422), although it asks
//! for exactly the same thing. Hash the parsed value instead: objects with
//! their members sorted, no insignificant whitespace, integral numbers
//! written as integers. Two bodies that parse to the same value have the
//! same fingerprint; any difference in a field's value changes it.

use serde::Serialize;
use serde_json::Value;
use taskfence::InputHash;

/// The fingerprint of a parsed request body (or of any serializable value):
/// the [`InputHash`] of its [`canonical_json`]. Use it as the input hash a
/// request key is bound to.
///
/// ```
/// use taskfence_axum::fingerprint;
/// let first: serde_json::Value = serde_json::from_str(r#"{"to": "ann", "amount": 10}"#).unwrap();
/// let retry: serde_json::Value = serde_json::from_str(r#"{ "amount":10.0,"to":"ann" }"#).unwrap();
/// let other: serde_json::Value = serde_json::from_str(r#"{"to": "ann", "amount": 11}"#).unwrap();
/// assert_eq!(fingerprint(&first).unwrap(), fingerprint(&retry).unwrap());
/// assert_ne!(fingerprint(&first).unwrap(), fingerprint(&other).unwrap());
/// ```
///
/// In a handler, over the fields it parsed (the same key with the same
/// fields is the same task, whatever the bytes):
///
/// ```
/// use axum::{Json, Router, extract::State, routing::post};
/// use taskfence::{MemoryStore, NewTask, RequestKey, TaskStore};
/// use taskfence_axum::{IdempotencyKey, Problem, SubmitResponse, fingerprint};
///
/// #[derive(serde::Deserialize, serde::Serialize)]
/// struct Transfer { to: String, amount: u64 }
///
/// async fn create(
///     State(store): State<MemoryStore>,
///     key: IdempotencyKey,
///     Json(transfer): Json<Transfer>,
/// ) -> Result<SubmitResponse, Problem> {
///     let input = fingerprint(&transfer).map_err(|e| Problem::new(http::StatusCode::BAD_REQUEST).with_detail(e.to_string()))?;
///     let new = NewTask::new(RequestKey::new("tenant-1", "transfer", key.as_str()), input);
///     Ok(SubmitResponse::new(store.submit(new).await))
/// }
/// let app: Router = Router::new().route("/transfers", post(create)).with_state(MemoryStore::new());
/// ```
///
/// # Errors
///
/// When `value` does not serialize to JSON (a map whose keys are not
/// strings, a serializer that fails).
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<InputHash, serde_json::Error> {
    Ok(InputHash::of([&b"json"[..], &canonical_json(value)?]))
}

/// `value` as canonical JSON: object members sorted by name (UTF-8 byte
/// order), no whitespace, strings escaped as `serde_json` escapes them, and
/// a number whose value is an integer within ±2⁵³ written as that integer
/// (`1.0` → `1`). Combine it with other inputs in your own
/// [`InputHash::of`] when the fingerprint covers more than the body.
///
/// ```
/// use taskfence_axum::canonical_json;
/// let value = serde_json::json!({"b": [1.0, 2.5, {"d": null, "c": "x"}], "a": true});
/// assert_eq!(canonical_json(&value).unwrap(), br#"{"a":true,"b":[1,2.5,{"c":"x","d":null}]}"#);
/// ```
///
/// # Errors
///
/// When `value` does not serialize to JSON.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let value = serde_json::to_value(value)?;
    let mut out = Vec::new();
    write(&value, &mut out)?;
    Ok(out)
}

/// The largest integer every JSON reader holds exactly (an IEEE double's 53 bits).
const EXACT: f64 = 9_007_199_254_740_992.0;

fn write(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, name)?;
                out.push(b':');
                write(member, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out)?;
            }
            out.push(b']');
        }
        Value::Number(n) => match n.as_f64() {
            // Integral and exact: one spelling for `1`, `1.0` and `1e0`.
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() <= EXACT => {
                // In range and integral, so the cast is exact.
                #[allow(clippy::cast_possible_truncation)]
                let i = f as i64;
                serde_json::to_writer(&mut *out, &i)?;
            }
            _ => serde_json::to_writer(&mut *out, n)?,
        },
        other => serde_json::to_writer(&mut *out, other)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        String::from_utf8(canonical_json(&value).unwrap()).unwrap()
    }

    #[test]
    fn reserialized_json_has_one_canonical_form() {
        let forms = [
            r#"{"a":1,"b":{"y":[1,2],"x":"é"}}"#,
            "{ \"b\" : { \"x\" : \"\\u00e9\", \"y\" : [ 1.0 , 2e0 ] } ,\n \"a\" : 1 }",
        ];
        for form in forms {
            assert_eq!(canon(form), r#"{"a":1,"b":{"x":"é","y":[1,2]}}"#, "{form}");
        }
    }

    #[test]
    fn any_change_of_a_value_changes_the_form() {
        let base = canon(r#"{"a":1,"s":"x","n":null,"l":[1,2]}"#);
        for changed in [
            r#"{"a":2,"s":"x","n":null,"l":[1,2]}"#,
            r#"{"a":1.5,"s":"x","n":null,"l":[1,2]}"#,
            r#"{"a":"1","s":"x","n":null,"l":[1,2]}"#,
            r#"{"a":1,"s":"X","n":null,"l":[1,2]}"#,
            r#"{"a":1,"s":"x","n":false,"l":[1,2]}"#,
            r#"{"a":1,"s":"x","l":[1,2]}"#,
            r#"{"a":1,"s":"x","n":null,"l":[2,1]}"#,
        ] {
            assert_ne!(canon(changed), base, "{changed}");
        }
        // Beyond 2^53 a float is not taken for an integer.
        assert_eq!(canon("1e300"), "1e+300");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
    }
}
