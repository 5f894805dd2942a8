//! Proof that the checker bites: each planted bug (a [`Rules`] variant
//! around the real rules) is rejected with a printed counterexample, naming
//! the property it breaks, in a trace of a known length (the shortest,
//! since the search is breadth-first).

use taskfence::policy::{AcceptanceRule, OnAmbiguous};

use crate::checker::check;
use crate::configs;
use crate::seam::Rules;
use crate::step::WorldModel;
use crate::world::Config;

fn caught(rules: Rules, config: Config, property: &str, len: usize) {
    let model = WorldModel { config, rules };
    let violation = match check(&model, 20_000_000) {
        Ok(report) => panic!("{rules:?} went unnoticed over {} states", report.states),
        Err(violation) => violation,
    };
    println!(
        "{rules:?} ({} states searched): {violation}",
        violation.report.states
    );
    assert!(
        violation.property.contains(property),
        "{rules:?} broke another property than expected: {violation}"
    );
    assert_eq!(violation.len, len, "{rules:?}: {violation}");
}

fn current() -> Config {
    configs::faults(AcceptanceRule::CurrentAssignment, OnAmbiguous::Retry)
}

fn first_valid() -> Config {
    configs::reopen(AcceptanceRule::FirstValidAnswer, OnAmbiguous::Retry)
}

#[test]
fn fence_before_lock() {
    caught(Rules::FenceBeforeLock, current(), "accepted, but the task was", 5);
}

#[test]
fn version_not_compared() {
    caught(
        Rules::VersionNotCompared,
        current(),
        "accepted, but the task was",
        6,
    );
}

#[test]
fn budget_counted_at_completion() {
    caught(Rules::BudgetAtCompletion, current(), "beyond the budget", 8);
}

#[test]
fn stale_release() {
    caught(Rules::StaleRelease, current(), "release by assignment", 7);
}

#[test]
fn accept_before_reopen() {
    caught(Rules::AcceptBeforeReopen, first_valid(), "did not allow it", 10);
}

#[test]
fn ambiguity_uncounted() {
    caught(Rules::AmbiguityUncounted, current(), "effect counts", 10);
}

#[test]
fn key_conflict_replaces() {
    caught(Rules::KeyConflictReplaces, current(), "wrote work", 3);
}

#[test]
fn due_misses_expired_leases() {
    caught(Rules::DueMissesExpiredLeases, current(), "liveness", 4);
}

#[test]
fn cancel_anything() {
    caught(Rules::CancelAnything, current(), "became", 5);
}

#[test]
fn any_completion_is_ours() {
    caught(Rules::AnyCompletionIsOurs, current(), "heard \"saved\"", 15);
}

#[test]
fn stale_unstarted_release_refunds() {
    caught(
        Rules::StaleUnstartedRefund,
        current(),
        "release_unstarted by assignment",
        6,
    );
}

#[test]
fn refund_after_work_began() {
    caught(Rules::RefundAfterWorkBegan, current(), "claims began work", 4);
}
