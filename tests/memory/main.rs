//! `MemoryStore`: the conformance, inspection and model suites, one test
//! binary.

mod conformance;
mod effects;
mod inspection;
mod model;
