//! Rebuilds when a file under `migrations/` changes: `sqlx::migrate!` embeds
//! them at compile time, and cargo does not track that on its own.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
