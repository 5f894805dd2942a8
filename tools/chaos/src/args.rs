//! `--name value` flags, parsed by hand: two small binaries do not need a CLI framework.

use std::collections::HashMap;
use std::str::FromStr;

/// Parsed `--name value` pairs (and bare `--flag`s, stored as `"true"`).
///
/// ```
/// let args = chaos::args::Args::parse(["--tasks", "200", "--restart"].map(String::from));
/// assert_eq!(args.get("tasks", 10u32), 200);
/// assert!(args.flag("restart"));
/// assert_eq!(args.get("workers", 3u32), 3);
/// ```
#[derive(Debug, Default)]
pub struct Args(HashMap<String, String>);

impl Args {
    /// Parses `args` (without the program name).
    ///
    /// # Panics
    ///
    /// On an argument that is not `--name` (a typo must not run a different experiment).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut map = HashMap::new();
        let mut it = args.into_iter().peekable();
        while let Some(arg) = it.next() {
            let name = arg
                .strip_prefix("--")
                .unwrap_or_else(|| panic!("unexpected argument {arg:?}; flags are --name value"));
            let value = match it.peek() {
                Some(next) if !next.starts_with("--") => it.next().expect("peeked"),
                _ => "true".to_owned(),
            };
            map.insert(name.to_owned(), value);
        }
        Self(map)
    }

    /// The process's own arguments.
    pub fn from_env() -> Self {
        Self::parse(std::env::args().skip(1))
    }

    /// The value of `--name`, or `default`.
    ///
    /// # Panics
    ///
    /// When the value does not parse.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> T {
        match self.0.get(name) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| panic!("--{name} {v:?} is not a valid value")),
            None => default,
        }
    }

    /// The string value of `--name`, if given.
    pub fn string(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    /// Whether `--name` was given (a bare flag or `--name true`).
    pub fn flag(&self, name: &str) -> bool {
        self.0.get(name).is_some_and(|v| v == "true")
    }
}
