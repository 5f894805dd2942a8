//! `serde` for the public data types (feature `serde`), so services can put
//! tasks, attempts and policies in their own APIs and logs.
//!
//! Most types derive their impls where they are defined; the ones here need a
//! representation that reads well in JSON and round-trips exactly:
//!
//! - [`Response`]: a string when its bytes are UTF-8 (the usual case: a reply's
//!   text), a sequence of bytes otherwise; both deserialize back to the same bytes.
//!   Unlike its `Debug`, serializing writes the content: keep it out of logs
//!   that must not hold replies.
//! - [`InputHash`]: 64 lowercase hex digits, as its `Display`.
//! - [`Status`] and [`AttemptOutcome`]: their storage names (`"completed"`,
//!   `"failed_retryable"`, …).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use taskfence::{Response, Status};
//! assert_eq!(serde_json::to_string(&Response::from("hi"))?, r#""hi""#);
//! assert_eq!(serde_json::from_str::<Status>(r#""completed""#)?, Status::Completed);
//! # Ok(()) }
//! ```

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::store::AttemptOutcome;
use crate::task::{InputHash, Response, Status};

impl Serialize for Response {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(self.as_bytes()) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => serializer.collect_seq(self.as_bytes()),
        }
    }
}

impl<'de> Deserialize<'de> for Response {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ResponseVisitor;
        impl<'de> Visitor<'de> for ResponseVisitor {
            type Value = Response;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a sequence of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Response, E> {
                Ok(Response::from(v))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Response, E> {
                Ok(Response::new(v.to_vec()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Response, A::Error> {
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(Response::new(bytes))
            }
        }
        deserializer.deserialize_any(ResponseVisitor)
    }
}

impl Serialize for InputHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for InputHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        let invalid = || de::Error::invalid_value(de::Unexpected::Str(&hex), &"64 hex digits");
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(invalid());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
        }
        Ok(InputHash::from_bytes(bytes))
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(de::Error::custom)
    }
}

impl Serialize for AttemptOutcome {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AttemptOutcome {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        AttemptOutcome::parse(&name)
            .ok_or_else(|| de::Error::invalid_value(de::Unexpected::Str(&name), &"an attempt outcome"))
    }
}
