//! `GET /`: the state of the store at a glance, reloading itself — tasks
//! by status (all, or one scope), by scope among the newest, the oldest
//! pending task's age, the stranded count, the latest failures.

use std::collections::BTreeMap;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::response::Html;
use maud::html;
use serde::Deserialize;
use taskfence::Status;
use taskfence::inspect::{Counts, Order, TaskQuery};
use taskfence::limits::{MAX_PAGE, MAX_SCOPE_LEN, check_text};
use time::OffsetDateTime;

use super::{bad_query, given, query_string};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

/// How many of the newest tasks the by-scope table is drawn from: a sample,
/// so the overview costs the same on a table of any size.
const SAMPLE: usize = 200;
/// How many recent failures are listed.
const FAILURES: usize = 10;

const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Running,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

#[derive(Debug, Deserialize)]
pub(crate) struct Params {
    scope: Option<String>,
}

pub(crate) async fn show(
    ctx: Ctx,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    let scope = given(&params.scope);
    if let Some(scope) = scope {
        check_text("scope", scope, MAX_SCOPE_LEN).map_err(|e| PageError::BadRequest(format!("{e}.")))?;
    }
    let _permit = ctx.shared.reads.enter()?;
    let store = &ctx.shared.store;
    let counts = store.counts_up_to(scope, ctx.shared.count_cap).await?;
    let mut newest = TaskQuery::new().limit(SAMPLE);
    let mut oldest_pending = TaskQuery::new()
        .status(Status::Pending)
        .order(Order::OldestFirst)
        .limit(1);
    let mut failures = TaskQuery::new().status(Status::Failed).limit(FAILURES);
    if let Some(scope) = scope {
        newest = newest.scope(scope);
        oldest_pending = oldest_pending.scope(scope);
        failures = failures.scope(scope);
    }
    let newest = store.list(&newest).await?.tasks;
    let oldest_pending = store.list(&oldest_pending).await?.tasks.into_iter().next();
    let failures = store.list(&failures).await?.tasks;
    let stranded = store.stranded(ctx.shared.stranded_after, MAX_PAGE).await?;
    let stranded: Vec<_> = stranded
        .iter()
        .filter(|t| scope.is_none_or(|s| t.key.scope == s))
        .collect();
    let now = OffsetDateTime::now_utc();

    let mut by_scope: BTreeMap<&str, Counts> = BTreeMap::new();
    for task in &newest {
        by_scope
            .entry(task.key.scope.as_str())
            .or_default()
            .add(task.status, 1);
    }
    let scope_pair = || ("scope", scope.unwrap_or_default().to_owned());
    let status_link = |s: Status| {
        ctx.href(&format!(
            "/tasks{}",
            query_string(&[("status", s.as_str().into()), scope_pair()])
        ))
    };

    let body = html! {
        h1 {
            "Overview"
            @if let Some(scope) = scope { " of scope " code { (scope) } }
        }
        form.filters method="get" action=(ctx.href("/")) {
            label { "Scope" input type="text" name="scope" value=[scope] placeholder="all scopes"; }
            button type="submit" { "Show" }
            @if scope.is_some() { a.button.secondary href=(ctx.href("/")) { "All scopes" } }
        }
        section.grid aria-label="Tasks by status" {
            @for status in STATUSES {
                a class={ "card stat " (status.as_str()) } href=(status_link(status)) {
                    span.n data-status=(status.as_str()) { (counts.get(status)) }
                    span.label { (status.as_str()) }
                }
            }
            a.card.stat href=(ctx.href(&format!("/tasks{}", query_string(&[scope_pair()])))) {
                span.n { (counts.total()) } span.label { "total" }
            }
        }
        section.grid.spaced {
            div.card.stat {
                span.n #oldest-pending {
                    @match &oldest_pending {
                        Some(t) => a href=(ctx.href(&format!("/tasks/{}", t.id))) { (html::ago(t.created_at, now)) },
                        None => "—",
                    }
                }
                span.label { "oldest pending" }
            }
            a.card.stat.failed href=(ctx.href("/stranded")) {
                span.n #stranded-count {
                    (stranded.len()) @if stranded.len() >= MAX_PAGE { "+" }
                }
                span.label { "stranded (unclaimed " (html::span(ctx.shared.stranded_after)) ")" }
            }
        }
        h2 { "Recent failures" }
        @if failures.is_empty() {
            p.muted { "No failed tasks." }
        } @else {
            div.table-wrap {
                table #recent-failures {
                    thead { tr { th { "Task" } th { "Operation / key" } th.wide { "Scope" } th { "Error" } th { "Failed" } } }
                    tbody {
                        @for t in &failures {
                            tr {
                                td.mono { a href=(ctx.href(&format!("/tasks/{}", t.id))) { (html::short(&t.id.to_string(), 13)) } }
                                td { (t.key.operation) " / " (html::private(&ctx, html! { code { (html::short(&t.key.key, 40)) } })) }
                                td.wide { (t.key.scope) }
                                td { @if t.last_error.is_some() { (html::private(&ctx, html! { (html::short(t.last_error.as_deref().unwrap_or(""), 120)) })) } }
                                td { @if let Some(at) = t.finished_at { (html::ago(at, now)) } }
                            }
                        }
                    }
                }
            }
        }
        h2 { "By scope" span.muted { " — among the " (newest.len()) " newest tasks" } }
        @if by_scope.is_empty() {
            p.muted { "No tasks yet." }
        } @else {
            div.table-wrap {
                table #by-scope {
                    thead { tr {
                        th { "Scope" }
                        @for s in STATUSES { th.num { (s.as_str()) } }
                    } }
                    tbody {
                        @for (name, c) in &by_scope {
                            tr {
                                td { a href=(ctx.href(&format!("/?scope={}", super::encode(name)))) { (name) } }
                                @for s in STATUSES { td.num { (c.get(s)) } }
                            }
                        }
                    }
                }
            }
        }
        p.muted { "Refreshes every " (html::span(ctx.shared.refresh)) ". Times are the store's records; ages are measured on this server's clock." }
    };
    Ok(html::page(
        &ctx,
        "Overview",
        Nav::Overview,
        Some(ctx.shared.refresh),
        body,
    ))
}
