//! The bounded reads of the request and the response bodies: neither is
//! ever buffered past its limit.

use std::fmt;

use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why a body was not read whole.
#[derive(Debug)]
pub(super) enum BodyReadError {
    /// The body went on past the limit; reading stopped there.
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body's stream failed (the client went away, the handler's
    /// stream returned an error).
    Failed(axum::BoxError),
}

impl fmt::Display for BodyReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { limit } => write!(f, "the body is over {limit} bytes"),
            Self::Failed(error) => write!(f, "the body could not be read: {error}"),
        }
    }
}

/// Reads `body` whole when it is at most `limit` bytes; stops at the first
/// frame past the limit (the rest is never polled) and drops the body.
pub(super) async fn read_bounded(body: Body, limit: usize) -> Result<Bytes, BodyReadError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
            Err(BodyReadError::TooLarge { limit })
        }
        Err(error) => Err(BodyReadError::Failed(error)),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_body_past_the_limit_is_not_read_on() {
        let polled = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&polled);
        let chunks = futures_util::stream::iter(0..1000).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1024]))
        });
        let error = read_bounded(Body::from_stream(chunks), 4 * 1024)
            .await
            .unwrap_err();
        assert!(
            matches!(error, BodyReadError::TooLarge { limit: 4096 }),
            "{error}"
        );
        assert_eq!(
            polled.load(Ordering::SeqCst),
            5,
            "the fifth chunk crossed the limit"
        );
        let exact = Body::from(vec![b'y'; 4096]);
        assert_eq!(read_bounded(exact, 4096).await.unwrap().len(), 4096);
    }
}
