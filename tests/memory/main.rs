//! `MemoryStore`: the conformance, inspection, limits and model suites, one test
//! binary.

mod conformance;
mod effects;
mod inspection;
mod limits;
mod model;
