//! The worlds checked. Each CI world turns on the faults that matter to a
//! few guarantees, small enough for seconds in a debug `cargo test`; the
//! deep world turns everything on at once.

use taskfence::policy::{AcceptanceRule, OnAmbiguous};

use crate::world::Config;

/// Two single-worker processes and one key submitted twice with the same
/// inputs and once with other inputs; the effect journal, a queue that
/// loses messages, lost group-commit answers, crashes, stops, releases,
/// one claim given back unstarted, failures of every kind and one cancellation.
pub(crate) fn faults(acceptance: AcceptanceRule, on_ambiguous: OnAmbiguous) -> Config {
    Config {
        processes: vec![1, 1],
        script: vec![(0, 0), (0, 0), (0, 1)],
        acceptance,
        on_ambiguous,
        max_attempts: 2,
        lease: 2,
        backoff: 1,
        max_backoff: 2,
        retention: 30,
        deadline: None,
        horizon: 3,
        slack: 4,
        reopens: 0,
        cancels: 1,
        unstarted: 1,
        effects: true,
        lossy_queue: true,
        lost_acks: true,
    }
}

/// One task with a budget of one attempt, failed or cancelled and then
/// reopened by an operator: a fresh budget, the old leases still about.
pub(crate) fn reopen(acceptance: AcceptanceRule, on_ambiguous: OnAmbiguous) -> Config {
    Config {
        script: vec![(0, 0)],
        max_attempts: 1,
        reopens: 1,
        lossy_queue: false,
        lost_acks: false,
        ..faults(acceptance, on_ambiguous)
    }
}

/// One worker; a Regenerate (a new key, the same inputs) beside the first key, records
/// purged when their retention ends and the key submitted again after (no
/// claim given back unstarted: the other worlds have those).
pub(crate) fn purge(acceptance: AcceptanceRule) -> Config {
    Config {
        processes: vec![1],
        script: vec![(0, 0), (1, 0), (0, 0)],
        retention: 2,
        lossy_queue: false,
        effects: false,
        lost_acks: false,
        cancels: 0,
        unstarted: 0,
        ..faults(acceptance, OnAmbiguous::Retry)
    }
}

/// The `faults` world with a two-worker process whose completions share a
/// group commit beside a one-worker process, a deadline and one reopening
/// (two attempts per budget, as in `faults`: a third made the world too
/// large to finish).
pub(crate) fn deep(acceptance: AcceptanceRule, on_ambiguous: OnAmbiguous) -> Config {
    Config {
        processes: vec![2, 1],
        max_attempts: 2,
        deadline: Some(6),
        reopens: 1,
        ..faults(acceptance, on_ambiguous)
    }
}
