//! The real rules, checked exhaustively.

use taskfence::policy::{AcceptanceRule, OnAmbiguous};

use crate::checker::{Order, check_in};
use crate::configs;
use crate::seam::Rules;
use crate::step::WorldModel;
use crate::world::Config;

/// States a configuration may reach before the search gives up.
const LIMIT: usize = 60_000_000;

fn holds(name: &str, config: Config) {
    holds_in(name, config, Order::Breadth);
}

fn holds_in(name: &str, config: Config, order: Order) {
    let model = WorldModel {
        config,
        rules: Rules::Real,
    };
    match check_in(&model, LIMIT, order) {
        Ok(report) => println!(
            "{name}: {} states, {} transitions, depth {}, in {:.1?}",
            report.states, report.transitions, report.depth, report.elapsed
        ),
        Err(violation) => panic!("{name}: {violation}"),
    }
}

#[test]
fn faults() {
    for (acceptance, on_ambiguous) in [
        (AcceptanceRule::CurrentAssignment, OnAmbiguous::Retry),
        (AcceptanceRule::FirstValidAnswer, OnAmbiguous::Stop),
    ] {
        holds(
            &format!("faults, {}, {on_ambiguous:?}", acceptance.as_str()),
            configs::faults(acceptance, on_ambiguous),
        );
    }
}

#[test]
fn reopen() {
    for (acceptance, on_ambiguous) in [
        (AcceptanceRule::CurrentAssignment, OnAmbiguous::Stop),
        (AcceptanceRule::FirstValidAnswer, OnAmbiguous::Retry),
    ] {
        holds(
            &format!("reopen, {}, {on_ambiguous:?}", acceptance.as_str()),
            configs::reopen(acceptance, on_ambiguous),
        );
    }
}

#[test]
fn purge() {
    for acceptance in [
        AcceptanceRule::CurrentAssignment,
        AcceptanceRule::FirstValidAnswer,
    ] {
        holds(
            &format!("purge, {}", acceptance.as_str()),
            configs::purge(acceptance),
        );
    }
}

/// The deep configuration, every combination of the two rules: run with
/// `TASKFENCE_CHECK_DEEP=1 cargo test -p model-check deep -- --nocapture`.
#[test]
fn deep() {
    if std::env::var_os("TASKFENCE_CHECK_DEEP").is_none() {
        println!("deep configuration skipped: set TASKFENCE_CHECK_DEEP=1 to run it");
        return;
    }
    for acceptance in [
        AcceptanceRule::CurrentAssignment,
        AcceptanceRule::FirstValidAnswer,
    ] {
        for on_ambiguous in [OnAmbiguous::Retry, OnAmbiguous::Stop] {
            holds_in(
                &format!("deep, {}, {on_ambiguous:?}", acceptance.as_str()),
                configs::deep(acceptance, on_ambiguous),
                Order::Depth,
            );
        }
    }
}
