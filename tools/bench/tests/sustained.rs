//! The sustained-load mode in miniature (`--sustained --quick`, one second
//! per phase, on a private cluster the harness starts): every phase runs on
//! every system, the report and both charts are written, and the check from
//! taskfence's own tables finds every task completed, none saved twice and
//! none over its retry budget, through connection kills and a server
//! restart. Speed is not asserted.

mod common;

use common::cells;

use std::process::Command;

const SYSTEMS: [&str; 2] = ["taskfence consumer", "awa"];

const PHASES: [&str; 9] = [
    "clean",
    "overload 1.5×",
    "recovery",
    "xmin held (idle in transaction)",
    "after the release",
    "4 REPEATABLE READ readers",
    "connections killed every second",
    "server restart",
    "recovery after restart",
];

#[test]
fn every_phase_runs_on_every_system_and_taskfence_loses_nothing() {
    let out = std::env::temp_dir().join(format!(
        "taskfence-bench-sustained-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    let run = Command::new(env!("CARGO_BIN_EXE_taskfence-bench"))
        .args(["--sustained", "--quick", "--phase-secs", "1", "--out"])
        .arg(&out)
        .output()
        .expect("run the harness");
    assert!(
        run.status.success(),
        "the harness failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let md = std::fs::read_to_string(out.join("sustained-results.md")).expect("sustained-results.md written");
    assert!(md.contains("## Sustained load"), "{md}");
    for system in SYSTEMS {
        for phase in PHASES {
            let prefix = format!("| {system} | {phase} |");
            let row = md
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no row {prefix} in:\n{md}"));
            let cells = cells(row);
            assert_eq!(cells.len(), 9, "{row}");
            for figure in [cells[2], cells[3], cells[6], cells[7]] {
                figure
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("{figure:?} in {row}"));
            }
        }
    }
    let check = md
        .lines()
        .find(|l| l.starts_with("| taskfence consumer | ") && cells(l).len() == 7)
        .unwrap_or_else(|| panic!("no check row for taskfence in:\n{md}"));
    let cells = cells(check);
    let enqueued: u64 = cells[1].parse().expect("enqueued");
    assert!(enqueued > 0, "the load enqueued something: {check}");
    assert_eq!(
        &cells[2..5],
        ["0", "0", "0"],
        "none left uncompleted, saved twice or over budget: {check}"
    );

    for chart in ["sustained-depth.svg", "sustained-p99.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).unwrap_or_else(|_| panic!("{chart} written"));
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{chart}"
        );
        for system in SYSTEMS {
            assert!(
                svg.contains(&format!("data-series=\"{system}\"")),
                "no line for {system} in {chart}"
            );
        }
    }
    std::fs::remove_dir_all(&out).expect("remove the output directory");
}
