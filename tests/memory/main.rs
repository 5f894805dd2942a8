//! `MemoryStore`: the conformance, inspection and model suites, one test
//! binary.

mod conformance;
mod dispatch;
mod effects;
mod inspection;
mod model;
