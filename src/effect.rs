//! The effect journal: external effects (a notification, a charge) with a
//! contract of their own.
//!
//! The saved response is guarded by the fenced completion; an effect outside
//! the store — an email sent, a card charged — is not, because a worker can
//! crash after the provider acted and before it saved anything. The journal
//! narrows that window to what can be narrowed and names what is left:
//!
//! 1. [`TaskStore::begin_effect`] records the **intent** (fenced by the
//!    lease) and hands out the effect's [`EffectKey`], the same on every
//!    attempt of the task: pass it as the provider's idempotency key.
//! 2. The worker calls the provider.
//! 3. [`TaskStore::finish_effect`] records the **outcome** (fenced by the
//!    lease): done, with the provider's reference, or failed.
//!
//! A later attempt that begins the same effect learns what happened: done →
//! [`EffectStart::Done`], skip the call and reuse the reference; an intent
//! with no outcome → the call's outcome is unknown (**ambiguous**), decided
//! by the task's [`OnAmbiguous`] policy: call again with the same key
//! ([`EffectStart::Call`] with `ambiguous` set, counted in
//! [`Effect::ambiguous`]) or stop ([`EffectStart::Stop`]) and let a person
//! decide.
//!
//! What that guarantees: with a provider that honours idempotency keys, the
//! effect happens once per task whatever crashes; with one that does not,
//! every call that may have repeated an earlier one is counted and visible in
//! the task's [story](crate::inspect::Story) — never silent.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> taskfence::Result<()> {
//! use std::time::Duration;
//! use taskfence::effect::{EffectOutcome, EffectStart};
//! use taskfence::*;
//!
//! let store = MemoryStore::new();
//! let task = store.submit(NewTask::new(RequestKey::new("u1", "chat.reply", "r1"), InputHash::of(["hi"]))).await?.into_task();
//! let Claim::Acquired(lease) = store.claim(task.id, ClaimRequest::new("w1", Duration::from_secs(30))).await? else { unreachable!() };
//!
//! match store.begin_effect(&lease, "notify-user").await?.into_result().expect("lease is current") {
//!     EffectStart::Call { key, .. } => {
//!         // provider.send(message, idempotency_key = key.as_str()) …
//!         let reference = format!("msg-for-{key}");
//!         store.finish_effect(&lease, "notify-user", EffectOutcome::done(reference)).await?;
//!     }
//!     EffectStart::Done(effect) => println!("sent before: {:?}", effect.reference),
//!     EffectStart::Stop(effect) => {
//!         store.fail(lease, effect.ambiguous_failure()).await?;
//!         return Ok(());
//!     }
//!     other => unreachable!("a newer answer: {other:?}"),
//! }
//! # Ok(()) }
//! ```

use std::fmt;

use time::OffsetDateTime;

#[cfg(doc)]
use crate::TaskStore;
use crate::error::InvalidInput;
use crate::limits;
use crate::policy::Failure;
#[cfg(doc)]
use crate::policy::OnAmbiguous;
use crate::task::TaskId;

/// The idempotency key of one effect of one task: `tf:<task id>:<effect name>`,
/// the same on every attempt (and after a reopening), so a provider that
/// honours idempotency keys recognises a repeated call. At most
/// [`limits::MAX_EFFECT_NAME_LEN`] + 40 bytes of ASCII: fits the usual limits
/// (255 characters) and any HTTP header.
///
/// ```
/// use taskfence::effect::EffectKey;
/// let task = taskfence::TaskId::new();
/// let key = EffectKey::new(task, "notify-user");
/// assert_eq!(key.as_str(), format!("tf:{task}:notify-user"));
/// assert_eq!(key, EffectKey::new(task, "notify-user"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct EffectKey(String);

impl EffectKey {
    /// The key of effect `name` of `task`. (`name` is validated where the
    /// store takes it: [`check_effect_name`](limits::check_effect_name).)
    pub fn new(task: TaskId, name: &str) -> Self {
        Self(format!("tf:{task}:{name}"))
    }

    /// The key as text, for the provider's idempotency-key field or header.
    ///
    /// ```
    /// # let key = taskfence::effect::EffectKey::new(taskfence::TaskId::new(), "charge-card");
    /// let header = ("Idempotency-Key", key.as_str());
    /// # assert!(header.1.ends_with(":charge-card"));
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an effect stands in the journal.
///
/// ```
/// use taskfence::effect::EffectState;
/// assert_eq!(EffectState::parse("intended"), Some(EffectState::Intended));
/// assert_eq!(EffectState::Done.as_str(), "done");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum EffectState {
    /// An attempt is about to call (or called) the provider; no outcome yet.
    Intended,
    /// The provider did it (its reference, if any, is saved).
    Done,
    /// The provider refused it for certain: calling again is safe.
    Failed,
}

impl EffectState {
    /// The stored name: `intended`, `done` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Intended => "intended",
            EffectState::Done => "done",
            EffectState::Failed => "failed",
        }
    }

    /// The state of a stored name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "intended" => Some(EffectState::Intended),
            "done" => Some(EffectState::Done),
            "failed" => Some(EffectState::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for EffectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One effect of one task, as the journal holds it: the latest attempt's
/// intent and, once known, its outcome.
///
/// ```
/// # fn f(effect: taskfence::effect::Effect) {
/// println!("{} {} by attempt {} (ambiguous {} times)", effect.name, effect.state, effect.attempt, effect.ambiguous);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Effect {
    /// The task it belongs to.
    pub task_id: TaskId,
    /// Its name, unique within the task (`notify-user`).
    pub name: String,
    /// The idempotency key for the provider.
    pub key: EffectKey,
    /// Where it stands.
    pub state: EffectState,
    /// The assignment version that last recorded the intent.
    pub version: u64,
    /// That assignment's attempt number.
    pub attempt: u32,
    /// The provider's reference, when done (a message id, a charge id).
    pub reference: Option<String>,
    /// Why the provider refused it, when failed.
    pub error: Option<String>,
    /// How many times a later attempt found an intent with no outcome and
    /// called again (the task's policy said retry): each is a call the
    /// provider may have seen twice, deduplicated only by the key.
    pub ambiguous: u32,
    /// When the first intent was recorded (store clock).
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub created_at: OffsetDateTime,
    /// When the latest intent was recorded.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339"))]
    pub intended_at: OffsetDateTime,
    /// When the outcome was recorded.
    #[cfg_attr(feature = "serde", serde(with = "time::serde::rfc3339::option"))]
    pub settled_at: Option<OffsetDateTime>,
}

impl Effect {
    /// A fresh intent of effect `name` by the assignment `version` (attempt
    /// `attempt`) at `now`: what a backend writes when nothing is recorded.
    ///
    /// ```
    /// use taskfence::effect::{Effect, EffectState};
    /// let e = Effect::intended(taskfence::TaskId::new(), "notify-user", 1, 1, time::OffsetDateTime::now_utc());
    /// assert_eq!(e.state, EffectState::Intended);
    /// ```
    pub fn intended(task_id: TaskId, name: &str, version: u64, attempt: u32, now: OffsetDateTime) -> Self {
        Self {
            task_id,
            name: name.to_owned(),
            key: EffectKey::new(task_id, name),
            state: EffectState::Intended,
            version,
            attempt,
            reference: None,
            error: None,
            ambiguous: 0,
            created_at: now,
            intended_at: now,
            settled_at: None,
        }
    }

    /// The [`Failure`] to end the task with when its policy stops on an
    /// ambiguous effect ([`EffectStart::Stop`]): [`Failure::ambiguous`],
    /// naming the effect and the attempt whose call has no known outcome.
    ///
    /// ```
    /// use taskfence::effect::Effect;
    /// let e = Effect::intended(taskfence::TaskId::new(), "charge-card", 2, 2, time::OffsetDateTime::now_utc());
    /// assert!(e.ambiguous_failure().message.contains("charge-card"));
    /// ```
    pub fn ambiguous_failure(&self) -> Failure {
        Failure::ambiguous(format!(
            "effect {} ({}): attempt {} recorded the intent and no outcome; the provider may have acted",
            self.name, self.key, self.attempt
        ))
    }
}

/// What [`TaskStore::begin_effect`] tells the worker to do.
///
/// ```
/// use taskfence::effect::EffectStart;
/// # fn f(start: EffectStart) {
/// match start {
///     EffectStart::Call { key, ambiguous: None } => { /* first call: use `key` */ }
///     EffectStart::Call { key, ambiguous: Some(earlier) } => {
///         // an earlier attempt may have called: the same key lets the provider tell
///         tracing::warn!(attempt = earlier.attempt, %key, "repeating a call whose outcome is unknown");
///     }
///     EffectStart::Done(effect) => { /* skip the call; reuse effect.reference */ }
///     EffectStart::Stop(effect) => { /* fail the task with effect.ambiguous_failure() */ }
///     _ => {}
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EffectStart {
    /// The intent is recorded: call the provider with `key`, then
    /// [`finish_effect`](TaskStore::finish_effect).
    Call {
        /// The effect's idempotency key.
        key: EffectKey,
        /// An earlier attempt's intent that has no outcome, when there was
        /// one: the provider may already have acted (the policy said retry).
        ambiguous: Option<Box<Effect>>,
    },
    /// An earlier attempt recorded it done: do not call again.
    Done(Box<Effect>),
    /// An earlier attempt's intent has no outcome and the task's policy is
    /// [`OnAmbiguous::Stop`]: do not call; end the task with
    /// [`Effect::ambiguous_failure`]. Nothing was written.
    Stop(Box<Effect>),
}

/// What one call of an external effect came to, as the work tells
/// [`WorkContext::effect`](crate::runtime::WorkContext::effect): it decides
/// what the journal records and how the attempt ends.
///
/// ```
/// use taskfence::Failure;
/// use taskfence::effect::EffectCall;
///
/// // An HTTP answer, read the usual way.
/// fn answered(status: u16) -> EffectCall {
///     match status {
///         200..=299 => EffectCall::Done(None),
///         429 | 503 => EffectCall::Refused(Failure::retryable(format!("answered {status}"))),
///         400..=499 if status != 408 && status != 409 => {
///             EffectCall::Refused(Failure::permanent(format!("answered {status}")))
///         }
///         _ => EffectCall::Unknown(format!("answered {status}")),
///     }
/// }
/// assert!(matches!(answered(503), EffectCall::Refused(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EffectCall {
    /// The provider acted: recorded done, with its reference (an id it
    /// gave) when there is one; the attempt succeeds with it as the response.
    Done(Option<String>),
    /// The provider did not act, for certain: recorded failed, and the
    /// attempt ends with this failure (retryable or permanent).
    Refused(Failure),
    /// The provider may or may not have acted (a timeout, a lost
    /// connection): nothing is recorded, and the attempt fails as ambiguous,
    /// so the next one calls again with the same key.
    Unknown(String),
}

impl EffectCall {
    /// An HTTP provider's answer, read the usual way (a webhook, a payment
    /// API), so no caller re-derives which statuses mean "it did not act":
    ///
    /// | status | the call |
    /// | --- | --- |
    /// | 2xx | [`Done`](Self::Done) (no reference: set it from the body) |
    /// | 429, 503 | [`Refused`](Self::Refused), retryable, after `retry_after` when it is a number of seconds (at most an hour) |
    /// | another 4xx but 408 and 409 | [`Refused`](Self::Refused), permanent |
    /// | 408, 409, another 5xx, anything else | [`Unknown`](Self::Unknown): it may have acted |
    ///
    /// `retry_after` is the `Retry-After` header's value; its HTTP-date form
    /// is ignored (the task's backoff applies).
    ///
    /// ```
    /// use std::time::Duration;
    /// use taskfence::effect::EffectCall;
    /// use taskfence::policy::FailureKind;
    ///
    /// assert_eq!(EffectCall::from_http_status(204, None), EffectCall::Done(None));
    /// let EffectCall::Refused(busy) = EffectCall::from_http_status(429, Some("7")) else { panic!() };
    /// assert_eq!((busy.kind, busy.retry_after), (FailureKind::Retryable, Some(Duration::from_secs(7))));
    /// let EffectCall::Refused(bad) = EffectCall::from_http_status(400, None) else { panic!() };
    /// assert_eq!(bad.kind, FailureKind::Permanent);
    /// assert!(matches!(EffectCall::from_http_status(409, None), EffectCall::Unknown(_)));
    /// assert!(matches!(EffectCall::from_http_status(502, None), EffectCall::Unknown(_)));
    /// ```
    pub fn from_http_status(status: u16, retry_after: Option<&str>) -> Self {
        let message = format!("answered HTTP {status}");
        match status {
            200..=299 => Self::Done(None),
            429 | 503 => {
                let after = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
                let failure = Failure::retryable(message);
                Self::Refused(match after {
                    Some(seconds) => failure.retry_after(std::time::Duration::from_secs(seconds.min(3600))),
                    None => failure,
                })
            }
            408 | 409 => Self::Unknown(message),
            400..=499 => Self::Refused(Failure::permanent(message)),
            _ => Self::Unknown(message),
        }
    }
}

/// What the provider said, for [`TaskStore::finish_effect`].
///
/// ```
/// use taskfence::effect::EffectOutcome;
/// let sent = EffectOutcome::done("msg_01H…");
/// let refused = EffectOutcome::failed("402: card declined");
/// # let _ = (sent, refused, EffectOutcome::done_without_reference());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum EffectOutcome {
    /// It happened.
    Done {
        /// The provider's reference, if it gives one.
        reference: Option<String>,
    },
    /// It did not happen, for certain (a refusal, not a timeout: an unknown
    /// outcome is recorded by recording nothing).
    Failed {
        /// Why.
        message: String,
    },
}

impl EffectOutcome {
    /// Done, with the provider's reference.
    pub fn done(reference: impl Into<String>) -> Self {
        EffectOutcome::Done {
            reference: Some(reference.into()),
        }
    }

    /// Done; the provider gives no reference.
    pub fn done_without_reference() -> Self {
        EffectOutcome::Done { reference: None }
    }

    /// Refused for certain.
    pub fn failed(message: impl Into<String>) -> Self {
        EffectOutcome::Failed {
            message: message.into(),
        }
    }

    /// Checks the outcome against the [`limits`]: a reference like an
    /// operation id, a message like a failure's (at most
    /// [`MAX_MESSAGE_LEN`](limits::MAX_MESSAGE_LEN) bytes of free text).
    ///
    /// ```
    /// use taskfence::effect::EffectOutcome;
    /// assert!(EffectOutcome::done("").validate().is_err());
    /// assert!(EffectOutcome::failed("declined").validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        match self {
            EffectOutcome::Done { reference: Some(r) } => {
                limits::check_text("reference", r, limits::MAX_OPERATION_ID_LEN)
            }
            EffectOutcome::Done { reference: None } => Ok(()),
            EffectOutcome::Failed { message } => {
                limits::check_len("message", message.len(), limits::MAX_MESSAGE_LEN)?;
                limits::check_free_text("message", message)
            }
        }
    }

    /// Applies the outcome to `effect` at `now`: what a backend stores.
    ///
    /// ```
    /// use taskfence::effect::{Effect, EffectOutcome, EffectState};
    /// let now = time::OffsetDateTime::now_utc();
    /// let mut e = Effect::intended(taskfence::TaskId::new(), "notify-user", 1, 1, now);
    /// EffectOutcome::done("m-1").apply(&mut e, now);
    /// assert_eq!((e.state, e.reference.as_deref()), (EffectState::Done, Some("m-1")));
    /// ```
    pub fn apply(&self, effect: &mut Effect, now: OffsetDateTime) {
        match self {
            EffectOutcome::Done { reference } => {
                effect.state = EffectState::Done;
                effect.reference = reference.clone();
                effect.error = None;
            }
            EffectOutcome::Failed { message } => {
                effect.state = EffectState::Failed;
                effect.reference = None;
                effect.error = Some(message.clone());
            }
        }
        effect.settled_at = Some(now);
    }
}
