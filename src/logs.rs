//! One shape for a service's log lines, whether or not they come from
//! inside the work function (feature `logs`):
//!
//! ```text
//! TIME LEVEL TARGET: EVENT_FIELDS [SPAN_FIELDS]
//! 2026-12-06T22:40:01.123456Z  INFO taskfence_kafka::journal: event=Released { … }
//! 2026-12-06T22:40:01.456789Z  INFO my_service::provider: calling task=… messaging.message.id=… taskfence.version=2 …
//! ```
//!
//! The event's own fields come first; the fields of the spans it happened
//! in follow, root first, as more `key=value` pairs: inside the work that
//! is the runtime's `process` span (`messaging.message.id`,
//! `taskfence.version`, `taskfence.attempt`…, names that never collide with
//! an event's). No span-name prefix (`process{…}:`) precedes the target, as
//! `tracing_subscriber`'s default format writes it, so a parser that splits
//! a line at its first `": "` after the level sees every line alike, and
//! loses none of the lines written inside the work.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of a service's logs: see the [module](self).
///
/// ```
/// tracing_subscriber::fmt()
///     .event_format(taskfence::logs::OneShape)
///     .with_writer(std::io::sink)
///     .finish();
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct OneShape;

impl<S, N> FormatEvent<S, N> for OneShape
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        SystemTime.format_time(&mut writer)?;
        write!(writer, " {:>5} {}: ", meta.level(), meta.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        for span in ctx.event_scope().into_iter().flat_map(|scope| scope.from_root()) {
            if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                && !fields.is_empty()
            {
                write!(writer, " {fields}")?;
            }
        }
        writeln!(writer)
    }
}

/// Installs the service's logger: `filter`, the [`OneShape`] lines on
/// stdout, colours only on a terminal (log collectors get plain text).
///
/// ```no_run
/// taskfence::logs::init(tracing_subscriber::EnvFilter::new("info"));
/// ```
///
/// # Panics
///
/// When a global subscriber is installed already (as `tracing_subscriber`'s
/// `init`).
pub fn init(filter: tracing_subscriber::EnvFilter) {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .event_format(OneShape)
        .init();
}

/// [`init`] from a filter in `EnvFilter` syntax (a `--log` flag or
/// `RUST_LOG`), then each of `warnings` logged as one `WARN` line: what a
/// service does first, so its start-up warnings (former names, unknown
/// variables: see [`config::startup_warnings`](crate::config::startup_warnings))
/// come in the same shape as every later line.
///
/// ```no_run
/// taskfence::logs::start("info,my_service=debug", ["a setting was renamed"])?;
/// # Ok::<(), tracing_subscriber::filter::ParseError>(())
/// ```
///
/// # Errors
///
/// The filter does not parse (nothing is installed then).
///
/// # Panics
///
/// As [`init`].
pub fn start<W: fmt::Display>(
    filter: &str,
    warnings: impl IntoIterator<Item = W>,
) -> Result<(), tracing_subscriber::filter::ParseError> {
    init(tracing_subscriber::EnvFilter::try_new(filter)?);
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    Ok(())
}
