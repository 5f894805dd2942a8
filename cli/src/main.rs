//! The `taskfence` command-line tool (being written).

fn main() {}
