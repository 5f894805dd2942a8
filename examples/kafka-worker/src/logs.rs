//! The service's log lines, in one shape whether or not they come from
//! inside the work function:
//!
//! ```text
//! TIME LEVEL TARGET: EVENT_FIELDS [SPAN_FIELDS]
//! 2026-12-06T22:40:01.123456Z  INFO taskfence_kafka::journal: event=Released { … }
//! 2026-12-06T22:40:01.456789Z  INFO kafka_worker::provider: calling task=… messaging.message.id=… taskfence.version=2 …
//! ```
//!
//! The event's own fields come first; the fields of the spans it happened
//! in follow, root first, as more `key=value` pairs: inside the work that
//! is the library's `process` span (`messaging.message.id`,
//! `taskfence.version`, `taskfence.attempt`…, names that never collide with
//! an event's). No span-name prefix (`process{…}:`) precedes the target, as
//! `tracing_subscriber`'s default format writes it, so a parser that splits
//! a line at its first `": "` after the level sees every line alike.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of the service's logs: see the [module](self).
///
/// ```
/// tracing_subscriber::fmt()
///     .event_format(kafka_worker::logs::OneShape)
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
pub fn init(filter: tracing_subscriber::EnvFilter) {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .event_format(OneShape)
        .init();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use taskfence::{Claim, ClaimRequest, MemoryStore, TaskStore};

    use super::*;

    /// A log line as a parser of the service's logs reads it.
    #[derive(Debug)]
    struct Line {
        level: String,
        target: String,
        /// The message, then the event's fields, then the spans'.
        rest: String,
    }

    /// `TIME LEVEL TARGET: REST`.
    fn parse(line: &str) -> Option<Line> {
        let (head, rest) = line.split_once(": ")?;
        let mut words = head.split_whitespace();
        let (_time, level, target) = (words.next()?, words.next()?, words.next()?);
        if words.next().is_some() {
            return None;
        }
        Some(Line {
            level: level.to_owned(),
            target: target.to_owned(),
            rest: rest.to_owned(),
        })
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_line_from_inside_the_work_parses_like_one_from_outside() {
        let store = MemoryStore::new();
        let task = store
            .submit(taskfence::testing::new_task("k"))
            .await
            .unwrap()
            .into_task();
        let Claim::Acquired(lease) = store
            .claim(task.id, ClaimRequest::new("w", Duration::from_secs(30)))
            .await
            .unwrap()
        else {
            panic!("claimed")
        };
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(OneShape)
            .with_writer({
                let buffer = buffer.clone();
                move || buffer.clone()
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(task = %task.id, "outside");
            // The span the runtime runs every work function in.
            let _inside = taskfence::trace::process_span(&lease).entered();
            tracing::info!(task = %task.id, "inside");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("process{"), "no span prefix:\n{text}");
        let lines: Vec<Line> = text
            .lines()
            .map(|l| parse(l).unwrap_or_else(|| panic!("unparsed: {l}")))
            .collect();
        let [outside, inside] = &lines[..] else {
            panic!("two lines:\n{text}");
        };
        let id = task.id.to_string();
        for (line, message) in [(outside, "outside"), (inside, "inside")] {
            assert_eq!(
                (line.level.as_str(), line.target.as_str()),
                ("INFO", module_path!())
            );
            assert!(line.rest.starts_with(&format!("{message} task={id}")), "{line:?}");
        }
        // The span's fields follow the event's, as more pairs.
        assert_eq!(outside.rest, format!("outside task={id}"));
        for field in [
            format!(" messaging.message.id={id}"),
            format!(" taskfence.version={}", lease.version()),
        ] {
            assert!(inside.rest.contains(&field), "{field} in {inside:?}");
        }
    }
}
