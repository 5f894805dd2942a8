//! The page frame (header, navigation, footer) and the small pieces every
//! page shows the same way: statuses, instants, ages, bytes. Built with
//! `maud`, which escapes every interpolated value.

use std::time::Duration;

use axum::response::Html;
use maud::{DOCTYPE, Markup, html};
use taskfence::Status;
use time::OffsetDateTime;

use crate::error::PageError;
use crate::request::Ctx;

/// Which navigation entry is the current page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Tasks,
    Stranded,
    Limits,
    None,
}

/// A full page: `title`, the navigation with `nav` current, `body`; with
/// `refresh`, the page reloads itself every so many seconds.
pub(crate) fn page(
    ctx: &Ctx,
    title: &str,
    nav: Nav,
    refresh: Option<Duration>,
    body: Markup,
) -> Html<String> {
    let entry = |target: Nav, path: &str, label: &str| {
        html! {
            a href=(ctx.href(path)) aria-current=[(nav == target).then_some("page")] { (label) }
        }
    };
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    @if let Some(every) = refresh {
                        meta http-equiv="refresh" content=(every.as_secs().max(1));
                    }
                    title { (title) " · taskfence" }
                    link rel="stylesheet" href=(ctx.href(&format!("/assets/{}", crate::assets::CSS_NAME)));
                    script src=(ctx.href(&format!("/assets/{}", crate::assets::JS_NAME))) defer {}
                }
                body {
                    header.top {
                        a.brand href=(ctx.href("/")) { "taskfence" }
                        nav {
                            (entry(Nav::Overview, "/", "Overview"))
                            (entry(Nav::Tasks, "/tasks", "Tasks"))
                            (entry(Nav::Stranded, "/stranded", "Stranded"))
                            (entry(Nav::Limits, "/limits", "Limits"))
                        }
                        form.find method="get" action=(ctx.href("/find")) role="search" {
                            input type="search" name="q" placeholder="task id or scope/operation/key"
                                aria-label="Find a task by id or request key";
                        }
                        div.session {
                            @if !ctx.actions_enabled() {
                                span.muted title="Started without an action token" { "read-only" }
                            } @else if let Some(csrf) = ctx.csrf() {
                                form method="post" action=(ctx.href("/logout")) {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button.link type="submit" { "Sign out" }
                                }
                            } @else {
                                a href=(ctx.href("/login")) { "Sign in" }
                            }
                        }
                    }
                    main { (body) }
                }
            }
        }
        .into_string(),
    )
}

/// The page of a [`PageError`].
pub(crate) fn error_page(ctx: &Ctx, error: &PageError) -> Html<String> {
    let status = error.status();
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! {
        section.error {
            h1 { (status.as_u16()) " " (title) }
            @match error {
                PageError::NotFound(what) => p { (what) },
                PageError::BadRequest(what) => p { (what) },
                PageError::SignInRequired { next, wrong_token } => {
                    @if *wrong_token {
                        p.flash.bad { "That is not the action token." }
                    }
                    p { "Reopening, cancelling and redispatching need the action token this dashboard was started with." }
                    (sign_in_form(ctx, next))
                }
                PageError::ReadOnly => p {
                    "This dashboard is read-only: it was started without an action token, so it cannot reopen, cancel or redispatch. "
                    "Start it with one (" code { "TASKFENCE_WEB_TOKEN=… taskfence web" } ") to enable the actions."
                },
                PageError::TaskDataHidden => p {
                    "This page shows task data (payloads, responses, request keys, errors), which only a signed-in "
                    "operator may see; this dashboard was started without an action token, so no one can sign in. "
                    "Start it with one, or with open reads where a proxy in front already limits who reaches it."
                },
                PageError::Throttled(wait) => p {
                    "Too many wrong tokens: signing in is closed for " (span(*wait)) ". Try again then."
                },
                PageError::Csrf => p {
                    "The form's CSRF value is missing or does not match this session: nothing was changed. "
                    "Go back, reload the page and try again."
                },
                PageError::Refused { action, id, rejection } => {
                    p { "The store refused to " (action) " task " a href=(ctx.href(&format!("/tasks/{id}"))) { code { (id) } } "; nothing was changed." }
                    p.reason {
                        "Reason: " code { (rejection.label()) } " — " (rejection)
                    }
                }
                PageError::Unavailable => p {
                    "The task store did not answer. The dashboard will show it again as soon as it does; "
                    "the cause is in this service's log."
                },
                PageError::Busy => p {
                    "The task store is busy: too many pages are reading it at once, or this read ran "
                    "past its time limit. Try again in a moment, or narrow the filters."
                },
                PageError::Internal(what) => p { (what) },
            }
            p { a href=(ctx.href("/")) { "Back to the overview" } }
        }
    };
    page(ctx, title, Nav::None, None, body)
}

/// The sign-in form, returning to `next` afterwards.
pub(crate) fn sign_in_form(ctx: &Ctx, next: &str) -> Markup {
    html! {
        form.card.signin method="post" action=(ctx.href("/login")) {
            input type="hidden" name="next" value=(next);
            label { "Action token " input type="password" name="token" autocomplete="current-password" required autofocus; }
            button type="submit" { "Sign in" }
        }
    }
}

/// `data` when this request may see task data, else a placeholder that
/// says why it is hidden.
pub(crate) fn private(ctx: &Ctx, data: Markup) -> Markup {
    if ctx.sees_task_data() {
        data
    } else {
        html! { span.muted.hidden title="Task data is shown to signed-in operators only" { "hidden: sign in to see" } }
    }
}

/// A status as a coloured badge.
pub(crate) fn status(status: Status) -> Markup {
    html! { span class={ "badge " (status.as_str()) } { (status.as_str()) } }
}

/// An instant, machine-readable for the script (which shows it in the
/// browser's time zone) and readable without it.
pub(crate) fn instant(at: OffsetDateTime) -> Markup {
    let utc = at.to_offset(time::UtcOffset::UTC);
    let text = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    );
    let machine = utc
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| text.clone());
    html! { time datetime=(machine) title=(text) { (text) } }
}

/// How long ago `at` was, as `3m 12s`.
pub(crate) fn ago(at: OffsetDateTime, now: OffsetDateTime) -> String {
    let d = now - at;
    if d.is_negative() {
        return "just now".into();
    }
    format!("{} ago", span(d.unsigned_abs()))
}

/// A duration in its two largest units: `450ms`, `12s`, `3m 12s`, `2h 5m`, `4d 2h`.
pub(crate) fn span(d: Duration) -> String {
    let s = d.as_secs();
    let two = |big: u64, a: &str, small: u64, b: &str| {
        if small == 0 {
            format!("{big}{a}")
        } else {
            format!("{big}{a} {small}{b}")
        }
    };
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => two(s / 60, "m", s % 60, "s"),
        3600..86400 => two(s / 3600, "h", s % 3600 / 60, "m"),
        _ => two(s / 86400, "d", s % 86400 / 3600, "h"),
    }
}

/// The duration between two instants, or `—` when it runs backwards.
pub(crate) fn between(from: OffsetDateTime, to: OffsetDateTime) -> String {
    let d = to - from;
    if d.is_negative() {
        "—".into()
    } else {
        span(d.unsigned_abs())
    }
}

/// The most shown of a byte string.
const SHOWN_BYTES: usize = 64 * 1024;

/// Bytes shown readably: UTF-8 text as text, anything else as a hex dump
/// (offset, 16 bytes in hex, the printable ones as ASCII). Longer than
/// 64 KiB, the rest is left off and said so.
pub(crate) fn bytes(data: &[u8]) -> Markup {
    let shown = &data[..data.len().min(SHOWN_BYTES)];
    // A cut may split a character: text is the longest valid prefix then.
    let text = match std::str::from_utf8(shown) {
        Ok(t) => Some(t),
        Err(e) if data.len() > SHOWN_BYTES && e.error_len().is_none() => {
            std::str::from_utf8(&shown[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    html! {
        @if data.is_empty() {
            p.muted { "(empty)" }
        } @else if let Some(text) = text {
            p.muted { (data.len()) " bytes, UTF-8 text" }
            pre.text { (text) }
        } @else {
            p.muted { (data.len()) " bytes, not UTF-8: hex" }
            pre.hex { (hex_dump(shown)) }
        }
        @if data.len() > SHOWN_BYTES {
            p.muted { "… " (data.len() - SHOWN_BYTES) " more bytes not shown." }
        }
    }
}

/// `00000010  68 65 6c 6c …  |hell…|` lines.
pub(crate) fn hex_dump(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 4 + 16);
    for (i, chunk) in data.chunks(16).enumerate() {
        use std::fmt::Write as _;
        let _ = write!(out, "{:08x}  ", i * 16);
        for j in 0..16 {
            match chunk.get(j) {
                Some(b) => {
                    let _ = write!(out, "{b:02x} ");
                }
                None => out.push_str("   "),
            }
            if j == 7 {
                out.push(' ');
            }
        }
        out.push_str(" |");
        out.extend(chunk.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        }));
        out.push_str("|\n");
    }
    out
}

/// Text cut to `max` characters with an ellipsis.
pub(crate) fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(span(Duration::from_millis(450)), "450ms");
        assert_eq!(span(Duration::from_secs(192)), "3m 12s");
        assert_eq!(span(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(span(Duration::from_secs(900)), "15m");
        assert_eq!(span(Duration::from_secs(4 * 86400 + 7200)), "4d 2h");
    }

    #[test]
    fn hex_dumps() {
        let dump = hex_dump(&[0, 159, 146, 150, b'a']);
        assert!(dump.starts_with("00000000  00 9f 92 96 61 "), "{dump}");
        assert!(dump.ends_with("|....a|\n"), "{dump}");
    }

    #[test]
    fn text_or_hex() {
        assert!(bytes(b"hello").into_string().contains("UTF-8 text"));
        assert!(bytes(&[0xff, 0xfe]).into_string().contains("hex"));
        let long = "é".repeat(SHOWN_BYTES); // the cut falls inside a character
        assert!(bytes(long.as_bytes()).into_string().contains("UTF-8 text"));
    }
}
