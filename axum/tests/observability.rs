//! The Grafana dashboard (`docs/grafana-dashboard.json`) and the Prometheus
//! alert rules (`docs/alerts.yml`) that ship with taskfence: they parse, every
//! PromQL expression in them parses, and they name only the metrics the
//! library emits (`taskfence::metrics::NAMES`), so a renamed metric breaks
//! this test rather than a production dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use promql_parser::parser::{Expr, VectorSelector};
use promql_parser::util::{ExprVisitor, parse_duration, walk_expr};
use serde::Deserialize;
use serde_json::Value;
use taskfence::metrics::{NAMES, OPERATION_DURATION_SECONDS};

fn docs(file: &str) -> String {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "docs", file].iter().collect();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every series name a Prometheus exporter shows for the library's metrics:
/// the names themselves, and the histogram's `_bucket`, `_sum` and `_count`.
fn exported_names() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
    for suffix in ["_bucket", "_sum", "_count"] {
        names.insert(format!("{OPERATION_DURATION_SECONDS}{suffix}"));
    }
    names
}

/// The metric names a PromQL expression selects.
#[derive(Default)]
struct Selected(BTreeSet<String>);

impl ExprVisitor for Selected {
    type Error = String;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
        let selector: Option<&VectorSelector> = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        if let Some(vs) = selector {
            let name = vs.name.clone().ok_or("a selector without a metric name")?;
            self.0.insert(name);
        }
        Ok(true)
    }
}

/// Parses `expr` (with Grafana's variables given sample values) and returns
/// the metric names it selects.
fn metrics_of(expr: &str) -> BTreeSet<String> {
    let expr = expr.replace("$__rate_interval", "5m").replace("$job", ".+");
    let ast = promql_parser::parser::parse(&expr).unwrap_or_else(|e| panic!("does not parse: {e}\n{expr}"));
    let mut selected = Selected::default();
    walk_expr(&mut selected, &ast).unwrap_or_else(|e| panic!("{e}: {expr}"));
    assert!(!selected.0.is_empty(), "selects no metric: {expr}");
    selected.0
}

fn assert_emitted(what: &str, used: &BTreeSet<String>) {
    let emitted = exported_names();
    let unknown: Vec<_> = used.difference(&emitted).collect();
    assert!(
        unknown.is_empty(),
        "{what} names metrics taskfence does not emit: {unknown:?}"
    );
}

/// A panel, or a row holding panels.
fn panels(list: &[Value]) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in list {
        out.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            out.extend(panels(inner));
        }
    }
    out
}

#[test]
fn the_dashboard_parses_and_names_only_emitted_metrics() {
    let dashboard: Value =
        serde_json::from_str(&docs("grafana-dashboard.json")).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "taskfence-overview");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36));

    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels(dashboard["panels"].as_array().expect("panels")) {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a numeric id")),
            "duplicate id: {title}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}: every panel says what it shows"
        );
        let targets = panel["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no queries");
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{title}: a target without expr"));
            used.extend(metrics_of(expr));
            queries += 1;
        }
    }
    // The `job` variable's query names a metric too.
    for variable in dashboard["templating"]["list"].as_array().expect("templating") {
        if let Some(definition) = variable["definition"].as_str() {
            let metric = definition
                .strip_prefix("label_values(")
                .and_then(|rest| rest.split(',').next())
                .unwrap_or_else(|| panic!("unexpected variable query: {definition}"));
            used.insert(metric.trim().to_owned());
        }
    }
    assert!(queries >= 10, "{queries} queries");
    assert_emitted("the dashboard", &used);
    // And it shows every metric there is.
    for name in NAMES {
        assert!(
            used.iter().any(|u| u.starts_with(name)),
            "the dashboard never shows {name}"
        );
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

/// An alerting rule as Prometheus reads it (a recording rule has `record`,
/// which this file has none of).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[test]
fn the_alert_rules_parse_name_only_emitted_metrics_and_are_explained() {
    let rules: RuleFile =
        serde_norway::from_str(&docs("alerts.yml")).expect("alerts.yml is a Prometheus rule file");
    let guide = docs("OBSERVABILITY.md");
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for group in &rules.groups {
        assert!(!group.name.is_empty());
        for rule in &group.rules {
            let name = &rule.alert;
            assert!(alerts.insert(name.clone()), "duplicate alert {name}");
            let selected = metrics_of(&rule.expr);
            used.extend(selected);
            if let Some(d) = &rule.for_ {
                parse_duration(d).unwrap_or_else(|e| panic!("{name}: for: {d}: {e}"));
            }
            let severity = rule.labels.get("severity").map(String::as_str);
            assert!(
                matches!(severity, Some("warning" | "critical")),
                "{name}: severity {severity:?}"
            );
            for annotation in ["summary", "description", "runbook_url"] {
                assert!(
                    rule.annotations
                        .get(annotation)
                        .is_some_and(|a| !a.trim().is_empty()),
                    "{name}: no {annotation}"
                );
            }
            // Each rule is explained in the guide, under a heading of its own name,
            // and its runbook link points there.
            assert!(
                guide.contains(&format!("### `{name}`")),
                "docs/OBSERVABILITY.md does not explain {name}"
            );
            let anchor = format!("OBSERVABILITY.md#{}", name.to_lowercase());
            assert!(
                rule.annotations["runbook_url"].ends_with(&anchor),
                "{name}: runbook_url {}",
                rule.annotations["runbook_url"]
            );
        }
    }
    assert_emitted("alerts.yml", &used);
    // The five concerns each have a rule.
    for (concern, metric) in [
        ("stranded work", "taskfence_stranded_tasks"),
        ("oldest pending age", "taskfence_oldest_pending_age_seconds"),
        ("failure ratio", "taskfence_tasks_failed_total"),
        ("takeover rate and storage errors", "taskfence_operations_total"),
    ] {
        assert!(used.contains(metric), "no rule on {concern} ({metric})");
    }
    for alert in [
        "TaskfenceTakeoverRateHigh",
        "TaskfenceStorageErrors",
        "TaskfenceFailureRatioHigh",
    ] {
        assert!(alerts.contains(alert), "no {alert}");
    }
}

#[test]
fn an_unknown_metric_or_a_broken_expression_is_caught() {
    // The checks above are only as good as these two refusals.
    let used = metrics_of("sum(rate(taskfence_operations_totl[5m]))");
    let emitted = exported_names();
    assert!(used.difference(&emitted).next().is_some());
    assert!(promql_parser::parser::parse("sum(rate(taskfence_operations_total[5m])").is_err());
    assert_eq!(
        metrics_of(
            "histogram_quantile(0.99, sum by (le) (rate(taskfence_operation_duration_seconds_bucket[$__rate_interval])))"
        ),
        BTreeSet::from(["taskfence_operation_duration_seconds_bucket".to_owned()])
    );
}
