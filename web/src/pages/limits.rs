//! `GET /limits`: the rate buckets, each with the tokens it holds now, and
//! one concurrency key's slots on request (`?key=`): which tasks hold them
//! and how many wait.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::response::Html;
use maud::html;
use serde::Deserialize;
use taskfence::limits::check_text;
use taskfence::throttle::MAX_NAME_LEN;
use time::OffsetDateTime;

use super::{bad_query, given};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

#[derive(Debug, Deserialize)]
pub(crate) struct Params {
    key: Option<String>,
}

pub(crate) async fn show(
    ctx: Ctx,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    let key = given(&params.key);
    if let Some(key) = key {
        check_text("key", key, MAX_NAME_LEN).map_err(|e| PageError::BadRequest(format!("{e}.")))?;
    }
    let _permit = ctx.shared.reads.enter()?;
    let store = &ctx.shared.store;
    let buckets = store.buckets().await?;
    let slots = match key {
        Some(key) => Some(store.concurrency(key).await?),
        None => None,
    };
    let now = OffsetDateTime::now_utc();
    let body = html! {
        h1 { "Limits" }
        p.muted {
            "Rate buckets pace the claims of the tasks that name them across every worker; a concurrency key "
            "runs at most its limit of tasks at once, each slot held by a live lease."
        }
        h2 { "Rate buckets" }
        @if buckets.is_empty() {
            p #no-buckets { "No rate bucket is defined in this store." }
        } @else {
            div.table-wrap {
                table #buckets {
                    thead { tr { th { "Bucket" } th { "Rate" } th { "Burst" } th { "Available now" } } }
                    tbody {
                        @for b in &buckets {
                            tr {
                                td { code { (b.bucket.name()) } }
                                td { (b.bucket.rate()) " per " (html::span(b.bucket.period())) }
                                td { (b.bucket.burst_size()) }
                                td data-available=(b.bucket.name()) { (b.available(now)) }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Concurrency key" }
        form.filters method="get" action=(ctx.href("/limits")) {
            label { "Key" input type="text" name="key" value=[key] placeholder="e.g. conversation-7"; }
            button type="submit" { "Show its slots" }
        }
        @if let Some(slots) = &slots {
            p #key-slots {
                code { (slots.key) } ": " (slots.running.len()) " running, " (slots.waiting) " waiting"
            }
            @if !slots.running.is_empty() {
                ul #slot-holders {
                    @for id in &slots.running {
                        li.mono { a href=(ctx.href(&format!("/tasks/{id}"))) { (id) } }
                    }
                }
            }
        }
    };
    Ok(html::page(&ctx, "Limits", Nav::Limits, None, body))
}
