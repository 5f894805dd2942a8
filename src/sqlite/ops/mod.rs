//! Every operation of [`SqliteStore`](super::SqliteStore) on one connection,
//! input already validated, at the store's instant `now` read once the
//! operation's transaction holds the write lock, whichever
//! [`Site`](super::site::Site) the connection comes from: the pool path and
//! the caller's transaction ([`SqliteConnStore`](super::SqliteConnStore))
//! run exactly this code.
//!
//! Each write reads the rows it decides on, decides with the
//! [`rules`](crate::backend::rules) every backend shares, and writes the
//! outcome, all under SQLite's one write lock (`BEGIN IMMEDIATE`): no other
//! writer can come between the read and the write, so the decision is the
//! one a locking transaction makes.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `row_io` | one task's row and attempts read and written: the steps every operation is made of |
//! | `single` | one task's writes: submit, claim, complete, fail, cancel, reopen, renew, release, record_operation, fence |
//! | `read` | one task's reads: get, find, attempts |
//! | `effect` | the effect journal: begin_effect, finish_effect, effects |
//! | `batch` | submit_many, claim_many, claim_next, renew_many, complete_many |
//! | `limits` | concurrency keys and rate buckets: what a claim's limits are decided on, define_bucket, drain_bucket, buckets, concurrency |
//! | `maintenance` | due, purge_expired, redispatch, the outbox's steps |
//! | `inspect` | the operator's queries: list, counts, story, stranded |

mod batch;
mod effect;
mod inspect;
mod limits;
mod maintenance;
mod read;
mod row_io;
mod single;

pub(crate) use batch::{claim_many, claim_next, complete_many, renew_many, submit_many};
pub(crate) use effect::{begin_effect, effects, finish_effect};
pub(crate) use inspect::{counts, counts_up_to, depth, list, story, stranded};
pub(crate) use limits::{buckets, concurrency, define_bucket, drain_bucket};
pub(crate) use maintenance::{due, mark_published, purge_expired, redispatch, take_handoffs};
pub(crate) use read::{attempts, find, get};
pub(crate) use single::{
    cancel, claim, claim_task, complete, decide_complete, fail, fence, record_operation, release, renew,
    reopen, submit,
};
