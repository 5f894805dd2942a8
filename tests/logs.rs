//! One log-line shape (`taskfence::logs`, feature `logs`): a line written
//! inside the runtime's `process` span parses like one written outside it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskfence::{Claim, ClaimRequest, MemoryStore, TaskStore};

use taskfence::logs::OneShape;

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
