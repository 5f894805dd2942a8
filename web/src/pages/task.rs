//! `GET /tasks/{id}`: one task's story drawn as a timeline — submission,
//! handoffs, every assignment version with its worker, lease, outcome and
//! timing, takeovers, reopenings — with its saved response, its payload and
//! what is left of its retry budget.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query};
use axum::response::Html;
use maud::{Markup, html};
use serde::Deserialize;
use taskfence::inspect::Story;
use taskfence::store::AttemptOutcome;
use taskfence::{Status, Task};
use time::OffsetDateTime;

use super::{bad_query, task_id};
use crate::error::PageError;
use crate::html::{self, Nav};
use crate::request::Ctx;

#[derive(Debug, Deserialize)]
pub(crate) struct Params {
    /// What an action just did, for the flash line (`reopened`, `cancelled`, `redispatched`).
    done: Option<String>,
}

pub(crate) async fn show(
    ctx: Ctx,
    Path(id): Path<String>,
    params: Result<Query<Params>, QueryRejection>,
) -> Result<Html<String>, PageError> {
    let id = task_id(&id)?;
    let Query(params) = params.map_err(bad_query)?;
    let _permit = ctx.shared.reads.enter()?;
    let story = ctx
        .shared
        .store
        .story(id)
        .await?
        .ok_or_else(|| PageError::NotFound(format!("No task with id {id} in this store.")))?;
    let now = OffsetDateTime::now_utc();
    let task = &story.task;
    let flash = match params.done.as_deref() {
        Some("reopened") if task.status == Status::Pending => Some(format!(
            "Reopened: the task is pending again with a fresh budget; its next claim gets version {}.",
            task.version + 1
        )),
        Some("reopened") => Some("Reopened with a fresh budget.".to_owned()),
        Some("cancelled") => Some("Cancelled: a worker still running it is fenced off.".to_owned()),
        Some("redispatched") => Some("Handed off again: the dispatcher publishes it.".to_owned()),
        _ => None,
    };
    let body = html! {
        @if let Some(flash) = flash { p.flash #flash { (flash) } }
        h1 { "Task " code #task-id { (task.id) } " " (html::status(task.status)) }
        (actions(&ctx, task))
        div.cols {
            section.card {
                h2.flush { "Task" }
                dl.facts {
                    dt { "Scope" } dd { (task.key.scope) }
                    dt { "Operation" } dd { (task.key.operation) }
                    dt { "Request key" } dd { (html::private(&ctx, html! { code { (task.key.key) } })) }
                    dt { "Input hash" } dd.mono { (html::short(&task.input_hash.to_string(), 24)) }
                    dt { "Submitted" } dd { (html::instant(task.created_at)) " (" (html::ago(task.created_at, now)) ")" }
                    @if let Some(at) = task.finished_at { dt { "Finished" } dd { (html::instant(at)) } }
                    dt { "Kept until" } dd { (html::instant(task.expires_at)) }
                    dt { "Acceptance" } dd { (task.acceptance.as_str()) }
                    @if let Some(e) = &task.last_error { dt { "Last error" } dd #last-error { (html::private(&ctx, html! { (e) })) } }
                }
            }
            (budget(task, now))
        }
        h2 { "Timeline" }
        (strip(&story, now))
        (timeline(&ctx, &story, now))
        (effects(&ctx, &story))
        div.cols {
            section {
                h2 { "Saved response" }
                @match &task.response {
                    Some(r) => div #response { (html::private(&ctx, html::bytes(r.as_bytes()))) },
                    None => p.muted { "None saved." },
                }
            }
            section {
                h2 { "Payload" }
                div #payload { (html::private(&ctx, html::bytes(&task.payload))) }
            }
        }
    };
    Ok(html::page(&ctx, &format!("Task {id}"), Nav::None, None, body))
}

/// The buttons to the confirmation pages of the actions that fit the status.
fn actions(ctx: &Ctx, task: &Task) -> Markup {
    let reopen = matches!(task.status, Status::Failed | Status::Cancelled);
    let cancel = matches!(task.status, Status::Pending | Status::Running);
    let redispatch = task.status == Status::Pending && ctx.shared.redispatch.is_some();
    html! {
        @if ctx.actions_enabled() && (reopen || cancel || redispatch) {
            div.actions {
                @if reopen { a.button #reopen href=(ctx.href(&format!("/tasks/{}/reopen", task.id))) { "Reopen…" } }
                @if cancel { a.button.danger #cancel href=(ctx.href(&format!("/tasks/{}/cancel", task.id))) { "Cancel…" } }
                @if redispatch {
                    a.button.secondary #redispatch href=(ctx.href(&format!("/redispatch?id={}", task.id))) { "Redispatch…" }
                }
            }
        }
    }
}

/// The retry budget: what is spent, what is left, what waits.
fn budget(task: &Task, now: OffsetDateTime) -> Markup {
    let p = &task.policy;
    html! {
        section.card #budget {
            h2.flush { "Retry budget" }
            dl.facts {
                dt { "Attempts left" } dd #attempts-left { strong { (task.attempts_left()) } " of " (p.max_attempts) }
                dt { "Used in this budget" } dd { (task.attempts_in_budget()) }
                @if task.budget_base > 0 {
                    dt { "Budget since" } dd { "version " (task.budget_base) " (reopened) at " (html::instant(task.budget_started_at)) }
                }
                dt { "Assignment version" } dd #version { "v" (task.version) }
                dt { "Deadline" } dd {
                    @match task.deadline_at() {
                        Some(at) if at > now => { (html::instant(at)) " (in " (html::between(now, at)) ")" },
                        Some(at) => { (html::instant(at)) " (passed)" },
                        None => "none",
                    }
                }
                dt { "Backoff" } dd {
                    (html::span(p.initial_backoff)) " × " (p.multiplier) " up to " (html::span(p.max_backoff))
                    ", jitter " (p.jitter)
                }
                @if let Some(at) = task.not_before.filter(|at| *at > now && task.status == Status::Pending) {
                    dt { "Next claim not before" } dd { (html::instant(at)) " (in " (html::between(now, at)) ")" }
                }
                @if let (Some(until), Status::Running) = (task.lease_until, task.status) {
                    dt { "Lease until" } dd {
                        (html::instant(until))
                        @if until < now { " — expired " (html::ago(until, now)) ", free to take over" }
                    }
                }
                dt { "Ambiguous outcome" } dd { (format!("{:?}", p.on_ambiguous).to_lowercase()) }
            }
        }
    }
}

/// The effect journal: each external effect, its key, where it stands, and
/// how often an attempt repeated its call without knowing the outcome.
fn effects(ctx: &Ctx, story: &Story) -> Markup {
    html! {
        @if !story.effects.is_empty() {
            h2 { "Effects" }
            table #effects {
                thead { tr { th { "Effect" } th { "State" } th { "Attempt" } th { "Ambiguous" } th { "Key" } th { "Outcome" } } }
                tbody {
                    @for e in &story.effects {
                        tr {
                            td { code { (e.name) } }
                            td { (e.state.as_str()) }
                            td { "#" (e.attempt) }
                            td { (e.ambiguous) }
                            td.mono { (e.key.as_str()) }
                            td {
                                @match (&e.reference, &e.error, e.settled_at) {
                                    (_, _, None) => span.muted { "no outcome recorded (intent at " (html::instant(e.intended_at)) ")" },
                                    (Some(r), _, Some(at)) => { "reference " (html::private(ctx, html! { code { (r) } })) " at " (html::instant(at)) },
                                    (None, Some(err), Some(at)) => { (html::private(ctx, html! { (err) })) " at " (html::instant(at)) },
                                    (None, None, Some(at)) => { "at " (html::instant(at)) },
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One line of the timeline.
struct Event {
    at: OffsetDateTime,
    /// Ties at the same instant keep the story's order.
    rank: u8,
    class: &'static str,
    body: Markup,
}

/// The story as a list of events, oldest first.
fn timeline(ctx: &Ctx, story: &Story, now: OffsetDateTime) -> Markup {
    let task = &story.task;
    let mut events = vec![Event {
        at: task.created_at,
        rank: 0,
        class: "submitted",
        body: html! {
            span.what { "Submitted" }
            div.detail {
                (task.key.scope) " / " (task.key.operation) " / " (html::private(ctx, html! { code { (task.key.key) } }))
                " · payload " (task.payload.len()) " bytes · up to " (task.policy.max_attempts) " attempts"
            }
        },
    }];
    for (i, h) in story.handoffs.iter().enumerate() {
        events.push(Event {
            at: h.created_at,
            // A later handoff follows the reopening that wrote it at the same instant.
            rank: if i == 0 { 1 } else { 5 },
            class: "handoff",
            body: html! {
                span.what { @if i == 0 { "Handoff written" } @else { "Handoff written again" } }
                div.detail {
                    "to the outbox, for the dispatcher to publish"
                    @if i > 0 { " (a reopening or a redispatch)" }
                }
            },
        });
        if let Some(at) = h.published_at {
            events.push(Event {
                at,
                rank: 2,
                class: "handoff",
                body: html! { span.what { "Published to the queue" } div.detail { "after " (html::between(h.created_at, at)) } },
            });
        }
    }
    for (i, a) in story.attempts.iter().enumerate() {
        let previous = i.checked_sub(1).and_then(|p| story.attempts.get(p));
        let takeover = previous.is_some_and(|p| p.outcome == AttemptOutcome::Expired);
        let current = u64::from(a.number) == task.version;
        let (class, outcome) = outcome(a.outcome, current && task.status == Status::Running, task, now);
        events.push(Event {
            at: a.started_at,
            rank: 3,
            class: if takeover { "takeover" } else { class },
            body: html! {
                span.version { "v" (a.number) }
                span.what {
                    @if takeover { "Taken over by " } @else { "Claimed by " }
                    code { (a.worker) }
                }
                div.detail {
                    @if let Some(p) = previous.filter(|_| takeover) {
                        "v" (p.number) " (" (p.worker) ") let its lease expire · "
                    }
                    (outcome)
                    @match a.finished_at {
                        Some(end) => { " after " (html::between(a.started_at, end)) " (ended " (html::instant(end)) ")" },
                        None if current && task.status == Status::Running => { ", for " (html::between(a.started_at, now)) " so far" },
                        None => {},
                    }
                    @if let Some(op) = &a.operation_id { " · operation " code { (op) } }
                }
                @if let Some(e) = &a.error { div.detail { "error: " (html::private(ctx, html! { (e) })) } }
            },
        });
    }
    for e in &story.effects {
        events.push(Event {
            at: e.intended_at,
            rank: 3,
            class: "effect",
            body: html! {
                span.what { "Effect " code { (e.name) } " intended by attempt #" (e.attempt) }
                @if e.ambiguous > 0 {
                    div.detail { "called again " (e.ambiguous) " time(s) after an intent without an outcome" }
                }
            },
        });
        if let Some(at) = e.settled_at {
            events.push(Event {
                at,
                rank: 3,
                class: "effect",
                body: html! { span.what { "effect " (e.name) " " (e.state.as_str()) } },
            });
        }
    }
    for r in &story.reopenings {
        events.push(Event {
            at: r.at,
            rank: 4,
            class: "reopened",
            body: html! {
                span.what { "Reopened (#" (r.number) ") by " (r.by) }
                div.detail { "from " (r.from) " at version " (r.version) " · fresh budget · " (html::private(ctx, html! { "“" (r.reason) "”" })) }
            },
        });
    }
    if let (Some(at), true) = (task.finished_at, task.status.is_terminal()) {
        let (class, what) = match task.status {
            Status::Completed => ("completed", "Completed: response saved"),
            Status::Failed => ("failed", "Failed terminally"),
            _ => ("cancelled", "Cancelled"),
        };
        events.push(Event {
            at,
            rank: 6,
            class,
            body: html! {
                span.what { (what) }
                @if task.status != Status::Completed {
                    @if let Some(e) = &task.last_error { div.detail { (html::private(ctx, html! { (e) })) } }
                }
            },
        });
    } else if task.status == Status::Pending {
        let waiting = match task.not_before {
            Some(nb) if nb > now => format!(
                "pending: backing off, the next claim in {}",
                html::between(now, nb)
            ),
            _ => "pending: waiting for a worker".to_owned(),
        };
        events.push(Event {
            at: now.max(events.iter().map(|e| e.at).max().unwrap_or(now)),
            rank: 7,
            class: "submitted",
            body: html! { span.what { "Now" } div.detail { (waiting) } },
        });
    }
    events.sort_by_key(|e| (e.at, e.rank));
    html! {
        ol.timeline #timeline {
            @for e in events {
                li class=(e.class) {
                    div.when { (html::instant(e.at)) }
                    (e.body)
                }
            }
        }
    }
}

/// An attempt's outcome: its marker's class and its words.
fn outcome(outcome: AttemptOutcome, live: bool, task: &Task, now: OffsetDateTime) -> (&'static str, String) {
    match outcome {
        AttemptOutcome::Running if live => match task.lease_until {
            Some(until) if until < now => (
                "expired",
                format!("holding an expired lease (since {})", html::ago(until, now)),
            ),
            Some(until) => (
                "running",
                format!("running, lease for {} more", html::between(now, until)),
            ),
            None => ("running", "running".to_owned()),
        },
        AttemptOutcome::Running => ("expired", "no outcome reported".to_owned()),
        AttemptOutcome::Completed => ("completed", "completed: its response was saved".to_owned()),
        AttemptOutcome::Failed(kind) => (
            "failed",
            format!("failed ({})", format!("{kind:?}").to_lowercase()),
        ),
        AttemptOutcome::Released => ("expired", "released the task".to_owned()),
        AttemptOutcome::Expired => ("expired", "lease expired without a report".to_owned()),
        AttemptOutcome::Cancelled => ("cancelled", "cancelled while running".to_owned()),
        AttemptOutcome::Overtaken => (
            "cancelled",
            "overtaken: an earlier attempt's answer was saved".to_owned(),
        ),
        AttemptOutcome::ReturnedUnstarted => (
            "expired",
            "returned unstarted: the claim was refunded to the budget".to_owned(),
        ),
        other => ("expired", other.as_str().replace('_', " ")),
    }
}

/// The attempts as bars on one time axis (submission to now or the end):
/// how long each ran, the gaps between them, where the reopenings fell.
fn strip(story: &Story, now: OffsetDateTime) -> Markup {
    let task = &story.task;
    if story.attempts.is_empty() {
        return html! {};
    }
    let start = task.created_at;
    let end = task
        .finished_at
        .filter(|_| task.status.is_terminal())
        .unwrap_or(now)
        .max(
            story
                .attempts
                .iter()
                .filter_map(|a| a.finished_at)
                .max()
                .unwrap_or(start),
        );
    let total = (end - start).as_seconds_f64().max(0.001);
    let (left, width, row) = (40.0, 760.0, 18.0);
    let x = |at: OffsetDateTime| left + width * ((at - start).as_seconds_f64() / total).clamp(0.0, 1.0);
    let height = row * story.attempts.len() as f64 + 24.0;
    html! {
        svg.strip viewBox=(format!("0 0 820 {height}")) role="img"
            aria-label=(format!("{} attempts over {}", story.attempts.len(), html::span((end - start).unsigned_abs()))) {
            line.axis x1=(left) y1=(height - 16.0) x2=(left + width) y2=(height - 16.0) stroke-width="1" {}
            text x=(left) y=(height - 2.0) { "submitted" }
            text x=(left + width) y=(height - 2.0) text-anchor="end" { "+" (html::span((end - start).unsigned_abs())) }
            @for r in &story.reopenings {
                line.axis x1=(x(r.at)) y1="0" x2=(x(r.at)) y2=(height - 16.0) stroke-width="2" stroke-dasharray="3 3" {}
            }
            @for (i, a) in story.attempts.iter().enumerate() {
                @let y = row * i as f64 + 2.0;
                @let finish = a.finished_at.unwrap_or(if u64::from(a.number) == task.version && task.status == Status::Running { now } else { a.started_at });
                @let (class, _) = outcome(a.outcome, a.finished_at.is_none() && task.status == Status::Running, task, now);
                text x="0" y=(y + 11.0) { "v" (a.number) }
                rect class=(class) x=(x(a.started_at)) y=(y) width=((x(finish) - x(a.started_at)).max(3.0)) height=(row - 6.0) rx="3" {
                    title { "v" (a.number) " " (a.worker) ": " (a.outcome.as_str()) }
                }
            }
        }
    }
}
