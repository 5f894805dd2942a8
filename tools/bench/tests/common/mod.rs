//! What the harness's tests share: reading the Markdown tables it prints.
#![allow(dead_code)] // each test binary uses a part

/// The cells of a Markdown table row, trimmed.
pub(crate) fn cells(row: &str) -> Vec<&str> {
    row.trim_matches('|').split('|').map(str::trim).collect()
}

/// A positive figure of `row` (a rate, or a ratio ending in `×`).
pub(crate) fn number(cell: &str, row: &str) -> f64 {
    let v: f64 = cell
        .strip_suffix('×')
        .unwrap_or(cell)
        .parse()
        .unwrap_or_else(|_| panic!("figure {cell:?} in {row:?}"));
    assert!(v > 0.0, "figure {cell:?} in {row:?}");
    v
}
