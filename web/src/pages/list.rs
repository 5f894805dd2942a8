//! `GET /tasks`: the command line's `list` as a page — status, scope,
//! operation, age and order filters, keyset pages — and `GET /find`, a task
//! by id or by request key.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;
use taskfence::inspect::{Cursor, Order, TaskQuery};
use taskfence::limits::MAX_PAGE;
use taskfence::{RequestKey, Status};
use time::OffsetDateTime;

use super::{bad_query, cutoff, given, query_string};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

/// The filters as the form sends them: text, checked here with a clear 400.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    status: Option<String>,
    scope: Option<String>,
    operation: Option<String>,
    older_than: Option<String>,
    newer_than: Option<String>,
    order: Option<String>,
    limit: Option<String>,
    after: Option<String>,
}

impl Params {
    /// The filters as query pairs (for the next page's link), without the cursor.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let v = |o: &Option<String>| given(o).unwrap_or_default().to_owned();
        vec![
            ("status", v(&self.status)),
            ("scope", v(&self.scope)),
            ("operation", v(&self.operation)),
            ("older_than", v(&self.older_than)),
            ("newer_than", v(&self.newer_than)),
            ("order", v(&self.order)),
            ("limit", v(&self.limit)),
        ]
    }

    /// The store's query, or a 400 naming the bad field.
    fn query(&self, now: OffsetDateTime) -> Result<TaskQuery, PageError> {
        let mut query = TaskQuery::new();
        if let Some(s) = given(&self.status) {
            let status: Status = s.parse().map_err(|_| {
                PageError::BadRequest(format!(
                    "status: {:?} is not a status: expected pending, running, completed, failed or cancelled.",
                    html::short(s, 40)
                ))
            })?;
            query = query.status(status);
        }
        if let Some(s) = given(&self.scope) {
            query = query.scope(s);
        }
        if let Some(o) = given(&self.operation) {
            query = query.operation(o);
        }
        if let Some(d) = given(&self.older_than) {
            query = query.created_before(cutoff("older than", d, now)?);
        }
        if let Some(d) = given(&self.newer_than) {
            query = query.created_after(cutoff("newer than", d, now)?);
        }
        query = query.order(match given(&self.order) {
            None | Some("newest") => Order::NewestFirst,
            Some("oldest") => Order::OldestFirst,
            Some(other) => {
                return Err(PageError::BadRequest(format!(
                    "order: {:?} is not an order: expected newest or oldest.",
                    html::short(other, 40)
                )));
            }
        });
        if let Some(l) = given(&self.limit) {
            let limit = l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    PageError::BadRequest(format!("limit: expected a number of tasks from 1 to {MAX_PAGE}."))
                })?;
            query = query.limit(limit);
        }
        if let Some(a) = given(&self.after) {
            let cursor: Cursor = a.parse().map_err(|_| {
                PageError::BadRequest(
                    "after: this is not a cursor of this listing; follow the \"Next page\" link, or start again from the first page."
                        .into(),
                )
            })?;
            query = query.after(cursor);
        }
        query
            .validate()
            .map_err(|e| PageError::BadRequest(format!("{e}.")))?;
        Ok(query)
    }
}

pub(crate) async fn show(
    ctx: Ctx,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    let now = OffsetDateTime::now_utc();
    let query = params.query(now)?;
    let _permit = ctx.shared.reads.enter()?;
    let page = ctx.shared.store.list(&query).await?;
    let filters = params.pairs();
    let next = page.next.map(|cursor| {
        let mut pairs = filters.clone();
        pairs.push(("after", cursor.to_string()));
        ctx.href(&format!("/tasks{}", query_string(&pairs)))
    });
    let first = ctx.href(&format!("/tasks{}", query_string(&filters)));
    let selected_status = given(&params.status);
    let oldest = given(&params.order) == Some("oldest");
    let body = html! {
        h1 { "Tasks" }
        form.filters method="get" action=(ctx.href("/tasks")) {
            label { "Status"
                select name="status" {
                    option value="" { "any" }
                    @for s in ["pending", "running", "completed", "failed", "cancelled"] {
                        option value=(s) selected[selected_status == Some(s)] { (s) }
                    }
                }
            }
            label { "Scope" input type="text" name="scope" value=[given(&params.scope)]; }
            label { "Operation" input type="text" name="operation" value=[given(&params.operation)]; }
            label { "Older than" input type="text" name="older_than" size="6" placeholder="1h" value=[given(&params.older_than)]; }
            label { "Newer than" input type="text" name="newer_than" size="6" placeholder="10m" value=[given(&params.newer_than)]; }
            label { "Order"
                select name="order" {
                    option value="newest" selected[!oldest] { "newest first" }
                    option value="oldest" selected[oldest] { "oldest first" }
                }
            }
            label { "Per page" input type="number" name="limit" min="1" max=(MAX_PAGE) size="4" value=(query.limit); }
            button type="submit" { "Apply" }
            a.button.secondary href=(ctx.href("/tasks")) { "Clear" }
        }
        @if page.tasks.is_empty() {
            p.muted #no-tasks { "No tasks match." }
        } @else {
            div.table-wrap {
                table #tasks {
                    thead { tr {
                        th { "Task" } th { "Status" } th { "Operation / key" } th.wide { "Scope" }
                        th.num { "Version" } th { "Submitted" } th.wide { "Last error" }
                    } }
                    tbody {
                        @for t in &page.tasks {
                            tr {
                                td.mono { a href=(ctx.href(&format!("/tasks/{}", t.id))) { (t.id) } }
                                td { (html::status(t.status)) }
                                td { (t.key.operation) " / " (html::private(&ctx, html! { code { (html::short(&t.key.key, 40)) } })) }
                                td.wide { (t.key.scope) }
                                td.num { "v" (t.version) }
                                td { (html::ago(t.created_at, now)) }
                                td.wide { @if t.last_error.is_some() { (html::private(&ctx, html! { (html::short(t.last_error.as_deref().unwrap_or(""), 80)) })) } }
                            }
                        }
                    }
                }
            }
        }
        nav.pager {
            @if query.after.is_some() { a href=(first) { "← First page" } }
            @if let Some(next) = next { a #next-page href=(next) rel="next" { "Next page →" } }
        }
    };
    Ok(html::page(&ctx, "Tasks", Nav::Tasks, None, body))
}

#[derive(Debug, Deserialize)]
pub(crate) struct FindParams {
    q: Option<String>,
}

/// `GET /find?q=`: a task id, or a request key as `scope/operation/key`
/// (the key may contain `/`); a redirect to the task's page, or 404.
pub(crate) async fn find(
    ctx: Ctx,
    params: Result<Query<FindParams>, QueryRejection>,
) -> Result<Response, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    let Some(q) = given(&params.q) else {
        return Err(PageError::BadRequest(
            "Type a task id, or a request key as scope/operation/key.".into(),
        ));
    };
    let store = &ctx.shared.store;
    let task = if let Ok(id) = q.parse::<taskfence::TaskId>() {
        store.get(id).await?
    } else {
        let mut parts = q.splitn(3, '/');
        let (Some(scope), Some(operation), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(PageError::BadRequest(format!(
                "{:?} is neither a task id (a UUID) nor a request key (scope/operation/key).",
                html::short(q, 80)
            )));
        };
        // A key is task data: finding by one would tell whether it exists.
        ctx.may_see_task_data(&format!("/find?q={}", super::encode(q)))?;
        let key = RequestKey::new(scope, operation, key);
        key.validate().map_err(|e| {
            PageError::BadRequest(format!("Not a request key: {e} (expected scope/operation/key)."))
        })?;
        store.find(&key).await?
    };
    match task {
        Some(task) => Ok(Redirect::to(&ctx.href(&format!("/tasks/{}", task.id))).into_response()),
        None => Err(PageError::NotFound(format!(
            "No task with the id or request key {:?} in this store.",
            html::short(q, 200)
        ))),
    }
}
