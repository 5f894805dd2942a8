//! Where the tables live: the schema name, validated once.

use crate::error::InvalidInput;

/// The schema [`PgStore::new`](super::PgStore::new) and [`migrate`](super::migrate()) use.
pub const DEFAULT_SCHEMA: &str = "taskfence";

/// A validated schema name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Schema(String);

impl Schema {
    pub(crate) fn new(name: &str) -> Result<Self, InvalidInput> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || name.len() > 63 {
            return Err(InvalidInput::NotAnIdentifier { field: "schema" });
        }
        Ok(Self(name.to_owned()))
    }

    pub(crate) fn name(&self) -> &str {
        &self.0
    }

    pub(crate) fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}
