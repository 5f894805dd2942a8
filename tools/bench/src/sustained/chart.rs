//! The sustained run's charts: one value per second against time, a line
//! per system, the phases marked along the time axis.

use std::fmt::Write as _;

use super::{Run, Second};
use crate::report::{STYLES, nice_step};

/// Queue depth (enqueued − started) over time.
pub(crate) fn depth(runs: &[Run], phases: Vec<&str>) -> String {
    chart(runs, &phases, "queue depth (tasks)", |s| Some(s.depth as f64))
}

/// Pickup p99 of each second over time, in milliseconds.
pub(crate) fn p99(runs: &[Run], phases: Vec<&str>) -> String {
    chart(runs, &phases, "pickup p99 (ms)", |s| {
        s.p99.map(|d| d.as_secs_f64() * 1e3)
    })
}

fn chart(runs: &[Run], phases: &[&str], title: &str, value: fn(&Second) -> Option<f64>) -> String {
    const W: f64 = 900.0;
    const H: f64 = 420.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 90.0;
    let t_max = runs
        .iter()
        .flat_map(|r| r.seconds.iter().map(|s| s.t))
        .fold(1.0_f64, f64::max);
    let top_value = runs
        .iter()
        .flat_map(|r| r.seconds.iter().filter_map(value))
        .fold(1.0_f64, f64::max);
    let step = nice_step(top_value / 5.0);
    let y_max = (top_value / step).ceil() * step;
    let (plot_w, plot_h) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |t: f64| LEFT + plot_w * t / t_max;
    let y = |v: f64| TOP + plot_h * (1.0 - v / y_max);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="15">{title}, per second</text>"#
    );
    let mut v = 0.0;
    while v <= y_max + 1e-9 {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y(v) + 4.0,
            y = y(v),
        );
        v += step;
    }
    // The phases of the first run (every run has the same), marked where each begins.
    if let Some(first) = runs.first() {
        for (index, name) in phases.iter().enumerate() {
            let Some(begin) = first.seconds.iter().find(|s| s.phase == index) else {
                continue;
            };
            let px = x((begin.t - 1.0).max(0.0));
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{}" stroke="#999" stroke-dasharray="3 3"/><text transform="translate({:.1},{}) rotate(30)" font-size="10">{name}</text>"##,
                H - BOTTOM,
                px + 2.0,
                H - BOTTOM + 12.0,
            );
        }
    }
    for (k, run) in runs.iter().enumerate() {
        let (color, dash) = STYLES[k % STYLES.len()];
        let points: Vec<String> = run
            .seconds
            .iter()
            .filter_map(|sec| value(sec).map(|v| format!("{:.1},{:.1}", x(sec.t), y(v))))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline data-series="{}" fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="{dash}" points="{}"/>"#,
            run.kind.name(),
            points.join(" ")
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="{color}">{}</text>"#,
            LEFT + 10.0 + 170.0 * k as f64,
            TOP - 8.0,
            run.kind.name()
        );
    }
    s.push_str("</svg>\n");
    s
}
