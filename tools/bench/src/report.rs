//! The report: Markdown tables, and the throughput chart as a standalone SVG.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Config, Mode, Res, db};

/// One point of the throughput chart.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub workers: usize,
    pub ours: f64,
    pub ceiling: f64,
}

/// Everything one run measured, as Markdown.
pub struct Report {
    md: String,
    points: Vec<Point>,
}

impl Report {
    pub fn new(cfg: &Config, machine: Vec<(String, String)>) -> Self {
        let mut md = String::new();
        let mode = match cfg.mode {
            Mode::Quick => "--quick (CI smoke run: tiny sizes, one round; figures meaningless)",
            Mode::Normal => "normal",
            Mode::Long => "--long",
        };
        let _ = writeln!(md, "# taskfence benchmark results\n");
        let _ = writeln!(md, "Mode: {mode}.\n");
        let _ = writeln!(md, "| machine / server | value |\n| --- | --- |");
        for (k, v) in machine {
            let _ = writeln!(md, "| {k} | {v} |");
        }
        let _ = writeln!(md, "| load average at start (1/5/15 min) | {} |", db::loadavg());
        Self {
            md,
            points: Vec::new(),
        }
    }

    /// Starts a section.
    pub fn section(&mut self, title: &str, intro: &str) {
        let _ = writeln!(self.md, "\n## {title}\n\n{intro}\n");
    }

    /// A table with a header row.
    pub fn table(&mut self, header: &[&str], rows: Vec<Vec<String>>) {
        let _ = writeln!(self.md, "| {} |", header.join(" | "));
        let _ = writeln!(self.md, "|{}", " --- |".repeat(header.len()));
        for row in rows {
            let _ = writeln!(self.md, "| {} |", row.join(" | "));
        }
        self.md.push('\n');
    }

    /// A paragraph.
    pub fn note(&mut self, text: &str) {
        let _ = writeln!(self.md, "{text}\n");
    }

    pub fn point(&mut self, p: Point) {
        self.points.push(p);
    }

    pub fn finish(&mut self, elapsed: Duration) {
        let _ = writeln!(
            self.md,
            "\nRun took {:.0} s; load average at the end (1/5/15 min): {}.",
            elapsed.as_secs_f64(),
            db::loadavg()
        );
    }

    pub fn markdown(&self) -> &str {
        &self.md
    }

    /// Writes `bench-results.md` and `throughput.svg` into `dir`.
    pub fn write(&self, dir: &Path) -> Res<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let md = dir.join("bench-results.md");
        let svg = dir.join("throughput.svg");
        std::fs::write(&md, &self.md)?;
        std::fs::write(&svg, chart(&self.points))?;
        Ok((md, svg))
    }
}

/// Lifecycles per second against workers, ours and the ceiling: two lines
/// over evenly spaced worker counts, each point labelled with its value.
pub fn chart(points: &[Point]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 400.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 60.0;
    let top_value = points
        .iter()
        .flat_map(|p| [p.ours, p.ceiling])
        .fold(1.0_f64, f64::max);
    let step = nice_step(top_value / 5.0);
    let y_max = (top_value / step).ceil() * step;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / points.len().max(1) as f64;
    let y = |v: f64| TOP + plot_h * (1.0 - v / y_max);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">Lifecycles per second (submit + claim + complete)</text>"#,
        W / 2.0
    );
    let mut tick = 0.0;
    while tick <= y_max + step / 2.0 {
        let ty = y(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{tick:.0}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            ty + 4.0
        );
        tick += step;
    }
    for (i, p) in points.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x(i),
            H - BOTTOM + 18.0,
            p.workers
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrent workers</text>"#,
        LEFT + plot_w / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">tasks / s</text>"#,
        TOP + plot_h / 2.0
    );
    for (name, color, dash, value) in [
        (
            "raw-SQL ceiling (3 autocommit statements)",
            "#d62728",
            "6 4",
            (|p: &Point| p.ceiling) as fn(&Point) -> f64,
        ),
        ("taskfence PgStore", "#1f77b4", "none", |p: &Point| p.ours),
    ] {
        let line: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(value(p))))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" data-series="{name}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"#,
            line.join(" ")
        );
        for (i, p) in points.iter().enumerate() {
            let (px, py) = (x(i), y(value(p)));
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{color}"/><text x="{:.1}" y="{:.1}" fill="{color}">{:.0}</text>"#,
                px + 7.0,
                py - 6.0,
                value(p)
            );
        }
    }
    for (i, (name, color)) in [("taskfence PgStore", "#1f77b4"), ("raw-SQL ceiling", "#d62728")]
        .iter()
        .enumerate()
    {
        let ly = TOP + 6.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            LEFT + 12.0,
            ly - 4.0,
            LEFT + 32.0,
            ly
        );
    }
    s.push_str("</svg>\n");
    s
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(130.0), 200.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(1000.0), 1000.0);
    }

    #[test]
    fn the_chart_has_one_line_per_series_and_one_marker_per_point() {
        let points = [
            Point {
                workers: 1,
                ours: 100.0,
                ceiling: 120.0,
            },
            Point {
                workers: 8,
                ours: 300.0,
                ceiling: 350.0,
            },
        ];
        let svg = chart(&points);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
