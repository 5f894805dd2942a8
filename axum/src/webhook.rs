//! [`Webhook`]: an HTTP `POST` to a receiver as an external effect, through
//! taskfence's effect journal, with the effect's key as its
//! `Idempotency-Key` (feature `webhook`).

use std::time::Duration;

use futures_util::future::BoxFuture;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use taskfence::effect::{EffectCall, EffectKey};
use taskfence::runtime::WorkContext;
use taskfence::{Failure, Response};

use crate::key::IDEMPOTENCY_KEY;

/// A webhook receiver: each task's payload `POST`ed to it as JSON, once per
/// task with a receiver that honours `Idempotency-Key`, whatever crashes.
///
/// Why: a webhook is the effect every service ends up sending ("your reply
/// is ready"), and each hand-written one decides again which answers mean
/// "it did not act" and which leave the outcome unknown. Here:
/// [`deliver`](Self::deliver) runs the call through
/// [`WorkContext::effect`] (intent recorded, the same key on every attempt,
/// outcome recorded), and the answer is read by
/// [`EffectCall::from_http_status`]: 2xx done (with the body's
/// [`reference`](Self::reference) field as the effect's reference), 429 and
/// 503 refused and retried after `Retry-After`, another 4xx but 408 and 409
/// refused for good, anything else — a timeout, a lost connection, 408, 409,
/// another 5xx — unknown, so the next attempt calls again with the same key
/// and the journal counts it ambiguous. A refused connection is refused
/// (nothing was sent) and retried.
///
/// ```no_run
/// # fn f() -> Result<(), reqwest::Error> {
/// use std::time::Duration;
/// use taskfence_axum::webhook::Webhook;
///
/// let hook = Webhook::new("http://hooks.internal:8080/ready".parse().unwrap(), Duration::from_secs(10))?
///     .reference("delivery_id");
/// // The work function of the notification tasks' consumer:
/// let work = move |ctx| {
///     let hook = hook.clone();
///     async move { hook.deliver(&ctx, "ready").await }
/// };
/// # let _ = work; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Webhook {
    client: reqwest::Client,
    url: reqwest::Url,
    reference: Option<String>,
}

impl Webhook {
    /// A client of `url` whose calls take at most `timeout`, connecting
    /// included (at most 5 s of it). Past it the outcome is unknown.
    ///
    /// ```
    /// let hook = taskfence_axum::webhook::Webhook::new(
    ///     "http://127.0.0.1:3001/ready".parse().unwrap(),
    ///     std::time::Duration::from_secs(10),
    /// );
    /// assert!(hook.is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// The HTTP client cannot be built (no TLS backend for an `https` URL, say).
    pub fn new(url: reqwest::Url, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()?;
        Ok(Self {
            client,
            url,
            reference: None,
        })
    }

    /// The member of a 2xx JSON body recorded as the effect's reference
    /// (the receiver's delivery id); without it, none is.
    ///
    /// ```
    /// # let hook = taskfence_axum::webhook::Webhook::new("http://127.0.0.1:1/".parse().unwrap(), std::time::Duration::from_secs(1)).unwrap();
    /// let hook = hook.reference("delivery_id");
    /// ```
    pub fn reference(mut self, member: impl Into<String>) -> Self {
        self.reference = Some(member.into());
        self
    }

    /// The work function of one task: its payload `POST`ed as effect
    /// `effect`, through the journal. Completes the task with the
    /// reference, or fails it as the answer says (see [`Webhook`]).
    ///
    /// ```no_run
    /// # async fn f(hook: taskfence_axum::webhook::Webhook, ctx: taskfence::runtime::WorkContext) {
    /// let outcome = hook.deliver(&ctx, "reply-ready").await;
    /// # }
    /// ```
    pub async fn deliver(&self, ctx: &WorkContext, effect: &str) -> Result<Response, Failure> {
        let body = ctx.task().payload.clone();
        ctx.effect(effect, |key| self.post(key, body)).await
    }

    /// [`deliver`](Self::deliver) as a consumer's work function: each task's
    /// payload `POST`ed as effect `effect`. What every service that delivers
    /// webhooks from a consumer of their own passes to `Consumer::run` (or
    /// `Consumer::spawn`).
    ///
    /// ```no_run
    /// # fn f(hook: taskfence_axum::webhook::Webhook, consumer: taskfence::runtime::Consumer<taskfence::runtime::StoreQueue>) {
    /// let delivering = consumer.spawn("notification worker", hook.work("reply-ready"));
    /// # }
    /// ```
    pub fn work(
        self,
        effect: &'static str,
    ) -> impl Fn(WorkContext) -> BoxFuture<'static, Result<Response, Failure>> + Send + Sync + 'static {
        move |ctx| {
            let hook = self.clone();
            Box::pin(async move { hook.deliver(&ctx, effect).await })
        }
    }

    /// One call with `key` as its `Idempotency-Key`, read as an [`EffectCall`]:
    /// for work that runs the journal itself.
    ///
    /// ```no_run
    /// # async fn f(hook: taskfence_axum::webhook::Webhook, key: taskfence::effect::EffectKey) {
    /// let call = hook.post(key, br#"{"type":"ready"}"#.to_vec()).await;
    /// # }
    /// ```
    pub async fn post(&self, key: EffectKey, body: Vec<u8>) -> EffectCall {
        let request = self
            .client
            .post(self.url.clone())
            .header(IDEMPOTENCY_KEY, key.as_str())
            .header(CONTENT_TYPE, "application/json");
        let response = match request.body(body).send().await {
            Ok(response) => response,
            // Nothing reached the receiver.
            Err(e) if e.is_connect() => {
                return EffectCall::Refused(Failure::retryable(format!("webhook unreachable: {e}")));
            }
            Err(e) => return EffectCall::Unknown(format!("webhook call without an answer: {e}")),
        };
        let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok());
        match EffectCall::from_http_status(response.status().as_u16(), retry_after) {
            // The receiver acted; an unreadable body only loses the reference.
            EffectCall::Done(_) => {
                let body = response.bytes().await.ok();
                let json = body.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                let reference = match (&self.reference, &json) {
                    (Some(member), Some(json)) => json.get(member).and_then(|v| v.as_str()),
                    _ => None,
                };
                EffectCall::Done(reference.map(str::to_owned))
            }
            other => other,
        }
    }
}
