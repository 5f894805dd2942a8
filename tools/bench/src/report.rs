//! The report: Markdown tables, and the throughput chart as a standalone SVG.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Config, Mode, Res, db};

/// One line of the throughput chart: tasks per second at each worker count.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: &'static str,
    /// A peer's line (drawn dotted).
    pub peer: bool,
    pub points: Vec<(usize, f64)>,
}

/// Everything one run measured, as Markdown.
pub(crate) struct Report {
    md: String,
    series: Vec<Series>,
}

impl Report {
    pub(crate) fn new(cfg: &Config, machine: Vec<(String, String)>) -> Self {
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
            series: Vec::new(),
        }
    }

    /// Starts a section.
    pub(crate) fn section(&mut self, title: &str, intro: &str) {
        let _ = writeln!(self.md, "\n## {title}\n\n{intro}\n");
    }

    /// A table with a header row.
    pub(crate) fn table(&mut self, header: &[&str], rows: Vec<Vec<String>>) {
        let _ = writeln!(self.md, "| {} |", header.join(" | "));
        let _ = writeln!(self.md, "|{}", " --- |".repeat(header.len()));
        for row in rows {
            let _ = writeln!(self.md, "| {} |", row.join(" | "));
        }
        self.md.push('\n');
    }

    /// A paragraph.
    pub(crate) fn note(&mut self, text: &str) {
        let _ = writeln!(self.md, "{text}\n");
    }

    pub(crate) fn series(&mut self, s: Series) {
        self.series.push(s);
    }

    pub(crate) fn finish(&mut self, elapsed: Duration) {
        let _ = writeln!(
            self.md,
            "\nRun took {:.0} s; load average at the end (1/5/15 min): {}.",
            elapsed.as_secs_f64(),
            db::loadavg()
        );
    }

    pub(crate) fn markdown(&self) -> &str {
        &self.md
    }

    /// Writes `bench-results.md` and `throughput.svg` into `dir`.
    pub(crate) fn write(&self, dir: &Path) -> Res<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let md = dir.join("bench-results.md");
        let svg = dir.join("throughput.svg");
        std::fs::write(&md, &self.md)?;
        std::fs::write(&svg, chart(&self.series))?;
        Ok((md, svg))
    }
}

/// The lines' colours and dash patterns, in the order the series come.
pub(crate) const STYLES: [(&str, &str); 6] = [
    ("#1f77b4", "none"),
    ("#2ca02c", "none"),
    ("#d62728", "6 4"),
    ("#ff7f0e", "2 3"),
    ("#9467bd", "2 3"),
    ("#8c564b", "2 3"),
];

/// Processing throughput against workers: one line per series over evenly
/// spaced worker counts (those of the first series), each point labelled.
pub(crate) fn chart(series: &[Series]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 440.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 50.0;
    const BOTTOM: f64 = 60.0;
    let workers: Vec<usize> = series
        .first()
        .map(|s| s.points.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    let top_value = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max);
    let step = nice_step(top_value / 5.0);
    let y_max = (top_value / step).ceil() * step;
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * (i as f64 + 0.5) / workers.len().max(1) as f64;
    let y = |v: f64| TOP + plot_h * (1.0 - v / y_max);

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">Processing throughput: no-op tasks per second, enqueued beforehand</text>"#,
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
    for (i, w) in workers.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{w}</text>"#,
            x(i),
            H - BOTTOM + 18.0
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
    for (k, line) in series.iter().enumerate() {
        let (color, dash) = STYLES[k % STYLES.len()];
        let coords: Vec<String> = line
            .points
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.1)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" data-series="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"#,
            line.name,
            coords.join(" ")
        );
        for (i, p) in line.points.iter().enumerate() {
            let (px, py) = (x(i), y(p.1));
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{color}"/><text x="{:.1}" y="{:.1}" fill="{color}">{:.0}</text>"#,
                px + 7.0,
                py - 6.0,
                p.1
            );
        }
        let ly = TOP + 6.0 + 18.0 * k as f64;
        let label = if line.peer {
            format!("{} (peer)", line.name)
        } else {
            line.name.to_owned()
        };
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}">{label}</text>"#,
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
pub(crate) fn nice_step(raw: f64) -> f64 {
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
        let series = [
            Series {
                name: "a",
                peer: false,
                points: vec![(1, 100.0), (8, 300.0)],
            },
            Series {
                name: "b",
                peer: true,
                points: vec![(1, 120.0), (8, 350.0)],
            },
        ];
        let svg = chart(&series);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("b (peer)"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
