//! What can go wrong talking to SQS, as one type: [`Error`].

use taskfence::TaskId;

/// An SQS call, a batch's input or the store failed.
///
/// Every variant is safe to retry as far as taskfence is concerned: a
/// message that was not deleted comes back when its visibility runs out, a
/// handoff that was not marked published goes again next round, and the
/// claim makes every extra copy harmless.
///
/// ```
/// let error = taskfence_sqs::Error::BatchSize { operation: "SendMessageBatch", len: 11 };
/// assert_eq!(error.to_string(), "a SendMessageBatch takes 1 to 10 entries, not 11");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The SDK reported an error for `operation` (with its whole context:
    /// the service's code and message, or the connection error).
    #[error("SQS {operation}: {message}")]
    Sqs {
        /// The SQS operation (`ReceiveMessage`, `SendMessageBatch`…).
        operation: &'static str,
        /// The SDK's error with its context.
        message: String,
    },
    /// A batch request was given no entries or more than
    /// [`MAX_BATCH`](crate::MAX_BATCH): nothing was sent.
    #[error("a {operation} takes 1 to {} entries, not {len}", crate::MAX_BATCH)]
    BatchSize {
        /// The batch operation.
        operation: &'static str,
        /// How many entries it was given.
        len: usize,
    },
    /// SQS refused some entries of a `SendMessageBatch` (the others reached
    /// the queue): the publishers keep the whole batch pending and send it again.
    #[error("SQS refused {} of {of} messages: {failed:?}", failed.len())]
    Refused {
        /// The refused entries: the task (when SQS named a known entry) and why.
        failed: Vec<(Option<TaskId>, String)>,
        /// How many the request carried.
        of: usize,
    },
    /// SQS answered without something it always sends (a queue URL, the
    /// queue's attributes).
    #[error("SQS {operation} answered without {missing}")]
    Incomplete {
        /// The SQS operation.
        operation: &'static str,
        /// What the answer lacked.
        missing: &'static str,
    },
    /// The hook of [`Dispatcher::round_checked`](crate::Dispatcher::round_checked)
    /// refused a batch that got through: it stays pending.
    #[error("publish not confirmed: {0}")]
    Unconfirmed(String),
    /// The task store failed (reading the outbox or the due tasks, marking handoffs).
    #[error(transparent)]
    Store(#[from] taskfence::Error),
}

impl Error {
    pub(crate) fn sdk<E: std::error::Error + Send + Sync + 'static>(
        operation: &'static str,
    ) -> impl FnOnce(E) -> Self {
        move |e| Self::Sqs {
            operation,
            message: aws_sdk_sqs::error::DisplayErrorContext(e).to_string(),
        }
    }
}

/// The crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
