//! Every operation of [`PgStore`](super::PgStore) on one connection, input
//! already validated, whichever [`Site`](super::site::Site) the connection
//! comes from: the pool path and the caller's connection or transaction
//! ([`PgConnStore`](super::PgConnStore)) run exactly this code.
//!
//! Each happy path is one statement; a refused write (zero rows) costs one
//! more read of the row with the store clock, classified by the same
//! [`rules`](crate::backend::rules) functions every backend uses.
//!
//! | module | what it holds |
//! | --- | --- |
//! | `fenced` | the guarded write and the re-read that says why it was refused |
//! | `single` | one task's writes: submit, claim, complete, fail, cancel, reopen, renew, release, record_operation, fence |
//! | `read` | one task's reads: get, find, attempts |
//! | `effect` | the effect journal: begin_effect, finish_effect, effects |
//! | `batch` | submit_many, claim_many, claim_next, renew_many, complete_many |
//! | `maintenance` | due, purge_expired, redispatch |
//! | `limits` | tasks naming a concurrency key or a rate bucket: their submissions, their claims under the limits' locks, `claim_next` while they wait, the buckets |
//! | `inspect` | the operator's queries: list, counts, story, stranded |

mod batch;
mod effect;
mod fenced;
mod inspect;
mod limits;
mod maintenance;
mod read;
mod single;

pub(crate) use batch::{claim_many, claim_next, complete_many, renew_many, submit_many};
pub(crate) use effect::{begin_effect, effects, finish_effect};
pub(crate) use inspect::{counts, depth, list, story, stranded};
pub(crate) use limits::{buckets, concurrency, define_bucket, drain_bucket};
pub(crate) use maintenance::{due, purge_expired, redispatch};
pub(crate) use read::{attempts, find, get};
pub(crate) use single::{
    cancel, claim, complete, fail, fence, record_operation, release, renew, reopen, submit,
};
