//! The actions — reopen, cancel, redispatch — each a confirmation page
//! (`GET`) and the change (`POST`), through the same store operations as the
//! command line. A change needs the action token (signed in, else 401) and
//! the form's CSRF value (else 403); a store's refusal is a 409 page with
//! its typed reason; done, the browser is sent to the task's page.

use std::time::Duration;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use taskfence::inspect::TaskSummary;
use taskfence::limits::{MAX_ATTEMPTS, MAX_BATCH, MAX_PAGE, MAX_WORKER_LEN, check_reason, check_text};
use taskfence::store::ReopenRequest;
use taskfence::{Fenced, Task, TaskId};

use super::{bad_query, duration, given, local_path, task_id};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

/// A form that could not be read at all.
fn bad_form(rejection: FormRejection) -> PageError {
    PageError::BadRequest(format!("The form cannot be read: {}.", rejection.body_text()))
}

/// The task, or 404.
async fn task(ctx: &Ctx, id: TaskId) -> Result<Task, PageError> {
    ctx.shared
        .store
        .get(id)
        .await?
        .ok_or_else(|| PageError::NotFound(format!("No task with id {id} in this store.")))
}

/// A summary of the task the action is about.
fn about(ctx: &Ctx, task: &Task) -> Markup {
    html! {
        p {
            "Task " a href=(ctx.href(&format!("/tasks/{}", task.id))) { code { (task.id) } } " "
            (html::status(task.status)) " · " (task.key.operation) " / " code { (html::short(&task.key.key, 60)) }
            " · version " (task.version) " · " (task.attempts_left()) " of " (task.policy.max_attempts) " attempts left"
        }
        @if let Some(e) = &task.last_error { p.muted { "Last error: " (html::short(e, 300)) } }
    }
}

/// A required reason: not blank, within the library's limits.
fn reason(value: &Option<String>) -> Result<String, PageError> {
    let reason = given(value)
        .ok_or_else(|| PageError::BadRequest("Say why: the reason is the audit trail.".into()))?;
    check_reason(reason).map_err(|e| PageError::BadRequest(format!("reason: {e}.")))?;
    Ok(reason.to_owned())
}

pub(crate) async fn confirm_reopen(ctx: Ctx, Path(id): Path<String>) -> Result<Html<String>, PageError> {
    let id = task_id(&id)?;
    ctx.may_confirm(&format!("/tasks/{id}/reopen"))?;
    let task = task(&ctx, id).await?;
    let csrf = ctx.csrf().unwrap_or_default();
    let body = html! {
        h1 { "Reopen this task?" }
        (about(&ctx, &task))
        p { "It becomes pending with a fresh retry budget and is due at once; its next claim gets version " (task.version + 1)
            ". Earlier attempts stay in its story, and their leases can never save." }
        @if !matches!(task.status, taskfence::Status::Failed | taskfence::Status::Cancelled) {
            p.flash.bad { "It is " (task.status) ": the store will refuse (only a failed or cancelled task can be reopened)." }
        }
        form.stack.card method="post" action=(ctx.href(&format!("/tasks/{id}/reopen"))) {
            input type="hidden" name="csrf" value=(csrf);
            label { "Who is reopening it" input type="text" name="by" required maxlength=(MAX_WORKER_LEN); }
            label { "Why (recorded with the reopening)" input type="text" name="reason" required; }
            label { "Attempts of the fresh budget (empty: the task's policy, " (task.policy.max_attempts) ")"
                input type="number" name="max_attempts" min="1" max=(MAX_ATTEMPTS); }
            div.actions {
                button #confirm type="submit" { "Reopen task" }
                a.button.secondary href=(ctx.href(&format!("/tasks/{id}"))) { "Back" }
            }
        }
    };
    Ok(html::page(&ctx, "Reopen", Nav::None, None, body))
}

#[derive(Debug, Deserialize)]
pub(crate) struct ReopenForm {
    csrf: Option<String>,
    by: Option<String>,
    reason: Option<String>,
    max_attempts: Option<String>,
}

pub(crate) async fn reopen(
    ctx: Ctx,
    Path(id): Path<String>,
    form: Result<Form<ReopenForm>, FormRejection>,
) -> Result<Response, PageError> {
    let id = task_id(&id)?;
    let csrf = form.as_ref().ok().and_then(|f| f.csrf.clone());
    ctx.authorize(csrf.as_deref(), &format!("/tasks/{id}/reopen"))?;
    let Form(form) = form.map_err(bad_form)?;
    let by = given(&form.by).ok_or_else(|| PageError::BadRequest("Say who is reopening it.".into()))?;
    check_text("by", by, MAX_WORKER_LEN).map_err(|e| PageError::BadRequest(format!("{e}.")))?;
    let mut request = ReopenRequest::new(by, reason(&form.reason)?);
    if let Some(n) = given(&form.max_attempts) {
        let n = n
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_ATTEMPTS).contains(n))
            .ok_or_else(|| {
                PageError::BadRequest(format!(
                    "Attempts of the fresh budget: expected 1 to {MAX_ATTEMPTS}."
                ))
            })?;
        let task = task(&ctx, id).await?;
        request = request.policy(task.policy.max_attempts(n));
    }
    request
        .validate()
        .map_err(|e| PageError::BadRequest(format!("{e}.")))?;
    match ctx.shared.store.reopen(id, request).await? {
        Fenced::Accepted(_) => {
            Ok(Redirect::to(&ctx.href(&format!("/tasks/{id}?done=reopened"))).into_response())
        }
        Fenced::Rejected(rejection) => Err(PageError::Refused {
            action: "reopen",
            id,
            rejection: Box::new(rejection),
        }),
    }
}

pub(crate) async fn confirm_cancel(ctx: Ctx, Path(id): Path<String>) -> Result<Html<String>, PageError> {
    let id = task_id(&id)?;
    ctx.may_confirm(&format!("/tasks/{id}/cancel"))?;
    let task = task(&ctx, id).await?;
    let csrf = ctx.csrf().unwrap_or_default();
    let body = html! {
        h1 { "Cancel this task?" }
        (about(&ctx, &task))
        p { "It becomes cancelled, a terminal status: no worker claims it again, and a worker still running it is refused when it renews or saves. "
            "A cancelled task can be reopened later." }
        @if task.status.is_terminal() {
            p.flash.bad { "It is " (task.status) " already: the store will refuse." }
        }
        form.stack.card method="post" action=(ctx.href(&format!("/tasks/{id}/cancel"))) {
            input type="hidden" name="csrf" value=(csrf);
            label { "Why (saved as the task's last error)" input type="text" name="reason" required; }
            div.actions {
                button.danger #confirm type="submit" { "Cancel task" }
                a.button.secondary href=(ctx.href(&format!("/tasks/{id}"))) { "Back" }
            }
        }
    };
    Ok(html::page(&ctx, "Cancel", Nav::None, None, body))
}

#[derive(Debug, Deserialize)]
pub(crate) struct CancelForm {
    csrf: Option<String>,
    reason: Option<String>,
}

pub(crate) async fn cancel(
    ctx: Ctx,
    Path(id): Path<String>,
    form: Result<Form<CancelForm>, FormRejection>,
) -> Result<Response, PageError> {
    let id = task_id(&id)?;
    let csrf = form.as_ref().ok().and_then(|f| f.csrf.clone());
    ctx.authorize(csrf.as_deref(), &format!("/tasks/{id}/cancel"))?;
    let Form(form) = form.map_err(bad_form)?;
    let reason = reason(&form.reason)?;
    match ctx.shared.store.cancel(id, &reason).await? {
        Fenced::Accepted(_) => {
            Ok(Redirect::to(&ctx.href(&format!("/tasks/{id}?done=cancelled"))).into_response())
        }
        Fenced::Rejected(rejection) => Err(PageError::Refused {
            action: "cancel",
            id,
            rejection: Box::new(rejection),
        }),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RedispatchParams {
    /// One task (from its page).
    id: Option<String>,
    /// Or the stranded tasks: unclaimed this long…
    older_than: Option<String>,
    /// …at most this many.
    limit: Option<String>,
}

/// 404 when this dashboard has no way to redispatch.
fn redispatcher(ctx: &Ctx) -> Result<&dyn crate::Redispatch, PageError> {
    ctx.shared.redispatch.as_deref().ok_or_else(|| {
        PageError::NotFound(
            "This dashboard has no redispatch: its store keeps no outbox (DynamoDB, memory). Publish the ids again from the application's queue."
                .into(),
        )
    })
}

pub(crate) async fn confirm_redispatch(
    ctx: Ctx,
    params: Result<Query<RedispatchParams>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let Query(params) = params.map_err(bad_query)?;
    redispatcher(&ctx)?;
    let (tasks, back) = match given(&params.id) {
        Some(id) => {
            let id = task_id(id)?;
            ctx.may_confirm(&format!("/redispatch?id={id}"))?;
            (
                vec![TaskSummary::from(task(&ctx, id).await?)],
                format!("/tasks/{id}"),
            )
        }
        None => {
            let older_than = match given(&params.older_than) {
                Some(t) => duration("older than", t)?,
                None => ctx.shared.stranded_after,
            };
            let limit = match given(&params.limit) {
                Some(l) => l
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        PageError::BadRequest(format!(
                            "limit: expected a number of tasks from 1 to {MAX_PAGE}."
                        ))
                    })?,
                None => 100,
            };
            ctx.may_confirm("/stranded")?;
            (
                ctx.shared.store.stranded(older_than, limit).await?,
                stranded_back(older_than, limit),
            )
        }
    };
    let csrf = ctx.csrf().unwrap_or_default();
    let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
    let body = html! {
        h1 { "Hand " (tasks.len()) " task(s) off again?" }
        p { "Each gets a new handoff, which the dispatcher publishes to the queue. Publishing a task twice is harmless: a claim decides who works on it." }
        @if tasks.is_empty() {
            p { "Nothing to redispatch." }
        } @else {
            ul { @for t in &tasks { li { a href=(ctx.href(&format!("/tasks/{}", t.id))) { code { (t.id) } } " " (html::status(t.status)) " " (t.key.operation) } } }
            form.card method="post" action=(ctx.href("/redispatch")) {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="ids" value=(ids.join(","));
                input type="hidden" name="back" value=(back);
                div.actions {
                    button #confirm type="submit" { "Redispatch" }
                    a.button.secondary href=(ctx.href(&back)) { "Back" }
                }
            }
        }
    };
    Ok(html::page(&ctx, "Redispatch", Nav::None, None, body))
}

fn stranded_back(older_than: Duration, limit: usize) -> String {
    let age = humantime::format_duration(older_than)
        .to_string()
        .replace(' ', "");
    format!("/stranded?older_than={age}&limit={limit}")
}

#[derive(Debug, Deserialize)]
pub(crate) struct RedispatchForm {
    csrf: Option<String>,
    ids: Option<String>,
    back: Option<String>,
}

pub(crate) async fn redispatch(
    ctx: Ctx,
    form: Result<Form<RedispatchForm>, FormRejection>,
) -> Result<Response, PageError> {
    let csrf = form.as_ref().ok().and_then(|f| f.csrf.clone());
    ctx.authorize(csrf.as_deref(), "/stranded")?;
    let redispatch = redispatcher(&ctx)?;
    let Form(form) = form.map_err(bad_form)?;
    let ids = given(&form.ids)
        .ok_or_else(|| PageError::BadRequest("No task ids to redispatch.".into()))?
        .split([',', ' ', '\n'])
        .filter(|s| !s.trim().is_empty())
        .map(task_id)
        .collect::<Result<Vec<_>, _>>()?;
    if ids.len() > MAX_BATCH {
        return Err(PageError::BadRequest(format!(
            "At most {MAX_BATCH} tasks at a time."
        )));
    }
    let n = redispatch.redispatch(&ids).await?;
    let back = local_path(given(&form.back));
    let sep = if back.contains('?') { '&' } else { '?' };
    let done = if back.starts_with("/tasks/") {
        "done=redispatched".to_owned()
    } else {
        format!("redispatched={n}")
    };
    Ok(Redirect::to(&ctx.href(&format!("{back}{sep}{done}"))).into_response())
}
