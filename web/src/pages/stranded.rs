//! `GET /stranded`: pending tasks nobody claimed long after their handoff —
//! their queue message was most likely lost — and the way to hand them off
//! again.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::response::Html;
use maud::html;
use serde::Deserialize;
use taskfence::limits::MAX_PAGE;
use time::OffsetDateTime;

use super::{bad_query, duration, given, query_string};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

#[derive(Debug, Deserialize)]
pub(crate) struct Params {
    older_than: Option<String>,
    limit: Option<String>,
    /// How many the redispatch action just handed off, for the flash line.
    redispatched: Option<String>,
}

pub(crate) async fn show(
    ctx: Ctx,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    let older_than = match given(&params.older_than) {
        Some(text) => duration("older than", text)?,
        None => ctx.shared.stranded_after,
    };
    let limit = match given(&params.limit) {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                PageError::BadRequest(format!("limit: expected a number of tasks from 1 to {MAX_PAGE}."))
            })?,
        None => 100,
    };
    let _permit = ctx.shared.reads.enter()?;
    let tasks = ctx.shared.store.stranded(older_than, limit).await?;
    let now = OffsetDateTime::now_utc();
    let age = humantime::format_duration(older_than)
        .to_string()
        .replace(' ', "");
    let confirm = ctx.href(&format!(
        "/redispatch{}",
        query_string(&[("older_than", age.clone()), ("limit", limit.to_string())])
    ));
    let ids: String = tasks.iter().map(|t| format!("{}\n", t.id)).collect();
    let body = html! {
        @if let Some(n) = given(&params.redispatched).and_then(|n| n.parse::<u64>().ok()) {
            p.flash #flash { "Handed off " (n) " task(s) again: the dispatcher publishes them." }
        }
        h1 { "Stranded tasks" }
        p.muted {
            "Pending, never claimed, and handed off more than " (html::span(older_than)) " ago: their queue message was most likely lost "
            "(a dead-letter queue, expired retention, a purged queue). Publishing them again is harmless: every copy names the same task."
        }
        form.filters method="get" action=(ctx.href("/stranded")) {
            label { "Unclaimed for" input type="text" name="older_than" size="8" value=(age); }
            label { "At most" input type="number" name="limit" min="1" max=(MAX_PAGE) value=(limit); }
            button type="submit" { "Show" }
        }
        @if tasks.is_empty() {
            p #no-stranded { "None: every handed-off task was claimed in time." }
        } @else {
            @if ctx.shared.redispatch.is_some() && ctx.actions_enabled() {
                div.actions { a.button #redispatch-all href=(confirm) { "Redispatch these " (tasks.len()) "…" } }
            } @else if ctx.shared.redispatch.is_none() {
                p { "This store keeps no outbox (DynamoDB, memory): publish these ids again from the application's queue." }
                textarea.ids #stranded-ids readonly { (ids) }
                button.secondary type="button" data-copy="stranded-ids" hidden { "Copy the ids" }
            }
            div.table-wrap {
                table #stranded {
                    thead { tr { th { "Task" } th { "Operation / key" } th.wide { "Scope" } th { "Submitted" } } }
                    tbody {
                        @for t in &tasks {
                            tr {
                                td.mono { a href=(ctx.href(&format!("/tasks/{}", t.id))) { (t.id) } }
                                td { (t.key.operation) " / " (html::private(&ctx, html! { code { (html::short(&t.key.key, 40)) } })) }
                                td.wide { (t.key.scope) }
                                td { (html::ago(t.created_at, now)) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html::page(&ctx, "Stranded", Nav::Stranded, None, body))
}
