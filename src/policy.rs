//! The retry budget stored with each task, and the pure functions that turn a
//! failure into "retry after this delay" or "stop".
//!
//! Backends call [`rules::plan`](crate::backend::rules::plan) so that the same failure leads to the
//! same decision on every backend; only the deadline check, which needs the
//! store's clock, is left to them.

use std::time::Duration;

use crate::error::InvalidInput;
use crate::limits;

/// [`Plan`] lives beneath the policy that produces it; its public path is
/// `taskfence::backend::Plan`, beside the rules that act on it.
pub(crate) mod plan;
use plan::Plan;

/// What a task does after an [ambiguous](FailureKind::Ambiguous) failure: the
/// request may have reached the provider and no answer came back.
///
/// ```
/// use taskfence::RetryPolicy;
/// use taskfence::policy::OnAmbiguous;
/// // A chat reply is worth possible duplicate model work…
/// let chat = RetryPolicy::default().on_ambiguous(OnAmbiguous::Retry);
/// // …a payment is not: stop and let a person decide.
/// let charge = RetryPolicy::default().on_ambiguous(OnAmbiguous::Stop);
/// assert_ne!(chat, charge);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OnAmbiguous {
    /// Retry within the budget, accepting that the provider may do the work twice.
    #[default]
    Retry,
    /// Fail the task terminally; nothing is resent automatically.
    Stop,
}

/// Which attempts may save the task's response. Chosen per task at
/// submission, stored with it and never changed, so one task never mixes the
/// two rules.
///
/// Under both rules at most one response is saved, a cancelled or terminal
/// task never saves, an attempt that never held a lease never saves, and only
/// the current assignment with a live lease may renew, fail, release or record
/// an operation. They differ only in which completion is accepted.
///
/// ```
/// use taskfence::{InputHash, NewTask, RequestKey};
/// use taskfence::policy::AcceptanceRule;
/// // Immutable inputs: the first answer from any attempt is as good as a later one.
/// let summary = NewTask::new(RequestKey::new("team-1", "doc.summary", "doc-9@v3"), InputHash::of(["doc-9", "v3"]))
///     .acceptance(AcceptanceRule::FirstValidAnswer);
/// assert_eq!(summary.acceptance, AcceptanceRule::FirstValidAnswer);
/// assert_eq!(AcceptanceRule::default(), AcceptanceRule::CurrentAssignment);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum AcceptanceRule {
    /// Only the current assignment, with an unexpired lease on the store's
    /// clock, may complete: a worker that was paused past its lease and taken
    /// over is refused (`Superseded` or `LeaseExpired`) and its answer is
    /// discarded. The default.
    #[default]
    CurrentAssignment,
    /// The first answer from any attempt that held a lease is saved, while no
    /// response is saved and the task is not terminal — also from a worker
    /// whose lease expired or that was taken over. Fewer wasted model calls;
    /// right only when every attempt works on the same immutable inputs.
    FirstValidAnswer,
}

impl AcceptanceRule {
    /// The lowercase name used in storage and logs.
    ///
    /// ```
    /// assert_eq!(taskfence::policy::AcceptanceRule::FirstValidAnswer.as_str(), "first_valid_answer");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            AcceptanceRule::CurrentAssignment => "current_assignment",
            AcceptanceRule::FirstValidAnswer => "first_valid_answer",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s output.
    ///
    /// ```
    /// use taskfence::policy::AcceptanceRule;
    /// assert_eq!(AcceptanceRule::parse("current_assignment"), Some(AcceptanceRule::CurrentAssignment));
    /// assert_eq!(AcceptanceRule::parse("any"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "current_assignment" => Some(AcceptanceRule::CurrentAssignment),
            "first_valid_answer" => Some(AcceptanceRule::FirstValidAnswer),
            _ => None,
        }
    }
}

/// Attempts, backoff with jitter and an elapsed-time deadline, stored with the
/// task so that a redelivery or a recovery never resets the allowance.
///
/// ```
/// use std::time::Duration;
/// use taskfence::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(4)
///     .initial_backoff(Duration::from_millis(500))
///     .max_backoff(Duration::from_secs(10))
///     .multiplier(3.0)
///     .jitter(0.0)
///     .deadline(Duration::from_secs(600));
/// assert!(policy.validate().is_ok());
/// assert_eq!(policy.base_delay(1), Duration::from_millis(500));
/// assert_eq!(policy.base_delay(2), Duration::from_millis(1500));
/// assert_eq!(policy.base_delay(9), Duration::from_secs(10)); // capped
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Most claims the task may get (a takeover counts). At least 1.
    pub max_attempts: u32,
    /// Delay after the first failed attempt.
    pub initial_backoff: Duration,
    /// Cap on every delay, jitter included.
    pub max_backoff: Duration,
    /// Growth of the delay per attempt, at least 1.0.
    pub multiplier: f64,
    /// Relative jitter band in `0.0..=1.0`: the delay is spread over `base × (1 ± jitter)`.
    pub jitter: f64,
    /// Elapsed-time budget from submission; no retry is scheduled past it.
    pub deadline: Option<Duration>,
    /// What an ambiguous failure does.
    pub on_ambiguous: OnAmbiguous,
}

// `f64` fields: equality is exact on the stored values, which is what a round trip needs.
impl Eq for RetryPolicy {}

impl Default for RetryPolicy {
    /// 5 attempts, 1 s doubling to at most 5 min, ±20 % jitter, no deadline, ambiguous → retry.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
            deadline: None,
            on_ambiguous: OnAmbiguous::Retry,
        }
    }
}

/// Why a task stopped being retried.
///
/// ```
/// assert_eq!(taskfence::policy::StopReason::DeadlineExhausted.as_str(), "deadline exhausted");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The failure was permanent.
    Permanent,
    /// The failure was ambiguous and the policy says [`OnAmbiguous::Stop`].
    Ambiguous,
    /// `max_attempts` claims have been made.
    AttemptsExhausted,
    /// The next attempt would start past the deadline.
    DeadlineExhausted,
}

impl StopReason {
    /// A short human-readable phrase.
    pub const fn as_str(self) -> &'static str {
        match self {
            StopReason::Permanent => "permanent failure",
            StopReason::Ambiguous => "ambiguous failure, policy stops",
            StopReason::AttemptsExhausted => "attempts exhausted",
            StopReason::DeadlineExhausted => "deadline exhausted",
        }
    }

    /// The `last_error` every backend records on a task that stopped: why it
    /// stopped, then the last failure's message.
    ///
    /// ```
    /// use taskfence::policy::StopReason;
    /// assert_eq!(StopReason::Permanent.message("400 bad prompt"), "permanent failure: 400 bad prompt");
    /// ```
    pub fn message(self, last_failure: &str) -> String {
        format!("{}: {last_failure}", self.as_str())
    }
}

impl RetryPolicy {
    /// Sets `max_attempts`.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    /// Sets `initial_backoff`.
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }
    /// Sets `max_backoff`.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }
    /// Sets `multiplier`.
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }
    /// Sets `jitter`.
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = j;
        self
    }
    /// Sets the elapsed-time `deadline`.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
    /// Sets `on_ambiguous`.
    pub fn on_ambiguous(mut self, o: OnAmbiguous) -> Self {
        self.on_ambiguous = o;
        self
    }

    /// Checks every field against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.max_attempts == 0 || self.max_attempts > limits::MAX_ATTEMPTS {
            return Err(out_of_range(
                "max_attempts",
                self.max_attempts,
                1,
                limits::MAX_ATTEMPTS,
            ));
        }
        limits::check_duration("initial_backoff", self.initial_backoff, limits::MAX_BACKOFF)?;
        limits::check_duration("max_backoff", self.max_backoff, limits::MAX_BACKOFF)?;
        if self.initial_backoff > self.max_backoff {
            return Err(InvalidInput::Inconsistent("initial_backoff exceeds max_backoff"));
        }
        if !(self.multiplier.is_finite() && (1.0..=100.0).contains(&self.multiplier)) {
            return Err(out_of_range("multiplier", self.multiplier, 1.0, 100.0));
        }
        if !(self.jitter.is_finite() && (0.0..=1.0).contains(&self.jitter)) {
            return Err(out_of_range("jitter", self.jitter, 0.0, 1.0));
        }
        if let Some(deadline) = self.deadline {
            limits::check_duration("deadline", deadline, limits::MAX_DEADLINE)?;
        }
        Ok(())
    }

    /// The delay after failed attempt number `attempt` (1-based), before jitter:
    /// `initial × multiplier^(attempt-1)`, capped at `max_backoff`.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(i32::MAX as u32) as i32;
        let secs = self.initial_backoff.as_secs_f64() * self.multiplier.powi(exponent);
        from_secs_capped(secs, self.max_backoff)
    }

    /// Spreads `base` over `base × (1 ± jitter)` using `unit` in `[0, 1)` as the
    /// random draw, then caps it at `max_backoff`. Pure: the caller supplies the randomness.
    pub fn jittered(&self, base: Duration, unit: f64) -> Duration {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        from_secs_capped(base.as_secs_f64() * factor, self.max_backoff)
    }

    /// The jittered delay after failed attempt `attempt`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        self.jittered(self.base_delay(attempt), unit)
    }

    /// Decides what a failure of attempt number `attempt` (1-based) leads to.
    /// `unit` is the jitter draw (see [`jitter_unit`](crate::backend::jitter_unit)). The deadline is not
    /// checked here: it needs the store's clock. Backends reach it through
    /// [`rules::plan`](crate::backend::rules::plan), which also applies a
    /// failure's own [`retry_after`](Failure::retry_after).
    pub(crate) fn plan(&self, kind: FailureKind, attempt: u32, unit: f64) -> Plan {
        match kind {
            FailureKind::Permanent => Plan::Stop(StopReason::Permanent),
            FailureKind::Ambiguous if self.on_ambiguous == OnAmbiguous::Stop => {
                Plan::Stop(StopReason::Ambiguous)
            }
            _ if attempt >= self.max_attempts => Plan::Stop(StopReason::AttemptsExhausted),
            _ => Plan::RetryAfter(self.delay(attempt, unit)),
        }
    }
}

fn from_secs_capped(secs: f64, cap: Duration) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    if secs >= cap.as_secs_f64() {
        return cap;
    }
    Duration::from_secs_f64(secs).min(cap)
}

fn out_of_range(
    field: &'static str,
    value: impl ToString,
    min: impl ToString,
    max: impl ToString,
) -> InvalidInput {
    InvalidInput::OutOfRange {
        field,
        value: value.to_string(),
        min: min.to_string(),
        max: max.to_string(),
    }
}

/// How a failed attempt failed: this decides whether it may be retried.
///
/// ```
/// use taskfence::policy::FailureKind;
/// assert_ne!(FailureKind::Ambiguous, FailureKind::Retryable);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum FailureKind {
    /// Nothing happened remotely (refused, rate-limited, a 4xx that invites retry): retry within budget.
    Retryable,
    /// Retrying cannot help (bad request, content refused): the task fails now.
    Permanent,
    /// The request may have reached the provider and no answer came back
    /// (timeout, connection reset mid-response, a 5xx). Never assume a server
    /// error means nothing happened: the policy's [`OnAmbiguous`] decides.
    Ambiguous,
}

impl FailureKind {
    /// The lowercase name used in storage and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureKind::Retryable => "retryable",
            FailureKind::Permanent => "permanent",
            FailureKind::Ambiguous => "ambiguous",
        }
    }
}

/// A failed attempt, as a worker reports it to [`TaskStore::fail`](crate::TaskStore::fail).
///
/// ```
/// use taskfence::Failure;
/// use taskfence::policy::FailureKind;
/// let f = Failure::ambiguous("read timeout after request was sent");
/// assert_eq!(f.kind, FailureKind::Ambiguous);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Failure {
    /// What happened, for people (stored as the task's `last_error`; no payloads, please).
    pub message: String,
    /// How it failed.
    pub kind: FailureKind,
    /// The delay the worker asks for before the next attempt (a provider's
    /// `Retry-After`), instead of the policy's backoff. The budget still
    /// decides: a failure that ends it stops the task, and a retry that would
    /// start at or after the deadline stops it too.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// A failure of the given kind.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind,
            retry_after: None,
        }
    }
    /// A [`FailureKind::Retryable`] failure.
    ///
    /// ```
    /// let f = taskfence::Failure::retryable("provider returned 503");
    /// assert!(f.retry_after.is_none());
    /// ```
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Retryable, message)
    }
    /// A [`FailureKind::Permanent`] failure.
    ///
    /// ```
    /// let f = taskfence::Failure::permanent("400: content refused");
    /// assert_eq!(f.kind, taskfence::policy::FailureKind::Permanent);
    /// ```
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Permanent, message)
    }
    /// A [`FailureKind::Ambiguous`] failure.
    ///
    /// ```
    /// let f = taskfence::Failure::ambiguous("read timeout after the request was sent");
    /// assert_eq!(f.kind, taskfence::policy::FailureKind::Ambiguous);
    /// ```
    pub fn ambiguous(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Ambiguous, message)
    }

    /// Asks for the next attempt after `delay` instead of the policy's
    /// backoff (a `429` with `Retry-After: 20`), within the task's budget:
    /// attempts and the deadline still decide whether there is a next one.
    ///
    /// ```
    /// use std::time::Duration;
    /// let f = taskfence::Failure::retryable("429").retry_after(Duration::from_secs(20));
    /// assert_eq!(f.retry_after, Some(Duration::from_secs(20)));
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// Checks the message and the requested delay against [`limits`].
    ///
    /// ```
    /// use std::time::Duration;
    /// assert!(taskfence::Failure::retryable("429").validate().is_ok());
    /// assert!(taskfence::Failure::retryable("429").retry_after(Duration::ZERO).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_len("failure message", self.message.len(), limits::MAX_MESSAGE_LEN)?;
        limits::check_free_text("failure message", &self.message)?;
        if let Some(delay) = self.retry_after {
            limits::check_duration("retry_after", delay, limits::MAX_BACKOFF)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::jitter_unit;
    use crate::task::AttemptId;

    #[test]
    fn jitter_of_attempts_made_back_to_back_spreads_over_the_whole_range() {
        // Ids made in a tight loop share milliseconds and carry a counter
        // where UUID v7 leaves room for randomness: the draws must still fall
        // evenly into every tenth of [0, 1). Expected 200 per bin; the bounds
        // are six standard deviations away, so only a skewed draw fails.
        let mut bins = [0u32; 10];
        for _ in 0..2000 {
            let unit = jitter_unit(AttemptId::new());
            assert!((0.0..1.0).contains(&unit), "{unit}");
            bins[(unit * 10.0) as usize] += 1;
        }
        for (i, &n) in bins.iter().enumerate() {
            assert!(
                (120..=280).contains(&n),
                "bin {i} got {n} of 2000 draws: {bins:?}"
            );
        }
    }

    #[test]
    fn jitter_is_the_same_for_the_same_attempt() {
        let attempt = AttemptId::new();
        assert_eq!(jitter_unit(attempt), jitter_unit(attempt));
    }

    #[test]
    fn default_policy_is_valid() {
        assert_eq!(RetryPolicy::default().validate(), Ok(()));
    }

    #[test]
    fn base_delay_grows_then_caps() {
        let p = RetryPolicy::default()
            .initial_backoff(Duration::from_secs(1))
            .max_backoff(Duration::from_secs(5));
        let delays: Vec<_> = (1..=5).map(|a| p.base_delay(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn jitter_band_edges() {
        let p = RetryPolicy::default()
            .jitter(0.5)
            .max_backoff(Duration::from_secs(100));
        let base = Duration::from_secs(10);
        assert_eq!(p.jittered(base, 0.0), Duration::from_secs(5));
        assert_eq!(p.jittered(base, 0.5), Duration::from_secs(10));
        assert_eq!(p.jittered(base, 1.0), Duration::from_secs(15));
        assert_eq!(p.jittered(base, f64::NAN), Duration::from_secs(10));
    }

    #[test]
    fn plan_follows_kind_and_budget() {
        let p = RetryPolicy::default().max_attempts(3).jitter(0.0);
        assert_eq!(
            p.plan(FailureKind::Permanent, 1, 0.3),
            Plan::Stop(StopReason::Permanent)
        );
        assert_eq!(
            p.plan(FailureKind::Ambiguous, 1, 0.3),
            Plan::RetryAfter(Duration::from_secs(1))
        );
        let stop = p.on_ambiguous(OnAmbiguous::Stop);
        assert_eq!(
            stop.plan(FailureKind::Ambiguous, 1, 0.3),
            Plan::Stop(StopReason::Ambiguous)
        );
        assert_eq!(
            p.plan(FailureKind::Retryable, 2, 0.3),
            Plan::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            p.plan(FailureKind::Retryable, 3, 0.3),
            Plan::Stop(StopReason::AttemptsExhausted)
        );
    }

    #[test]
    fn validate_rejects_each_bad_field() {
        let d = RetryPolicy::default();
        assert!(matches!(
            d.max_attempts(0).validate(),
            Err(InvalidInput::OutOfRange {
                field: "max_attempts",
                ..
            })
        ));
        assert!(matches!(
            d.max_attempts(1001).validate(),
            Err(InvalidInput::OutOfRange {
                field: "max_attempts",
                ..
            })
        ));
        assert!(matches!(
            d.initial_backoff(Duration::ZERO).validate(),
            Err(InvalidInput::ZeroDuration { .. })
        ));
        assert!(matches!(
            d.max_backoff(Duration::MAX).validate(),
            Err(InvalidInput::DurationTooLong { .. })
        ));
        assert!(matches!(
            d.multiplier(0.5).validate(),
            Err(InvalidInput::OutOfRange {
                field: "multiplier",
                ..
            })
        ));
        assert!(matches!(
            d.multiplier(f64::NAN).validate(),
            Err(InvalidInput::OutOfRange { .. })
        ));
        assert!(matches!(
            d.jitter(1.5).validate(),
            Err(InvalidInput::OutOfRange { field: "jitter", .. })
        ));
        assert!(matches!(
            d.jitter(-0.1).validate(),
            Err(InvalidInput::OutOfRange { .. })
        ));
        assert!(matches!(
            d.deadline(Duration::ZERO).validate(),
            Err(InvalidInput::ZeroDuration { field: "deadline" })
        ));
        assert!(matches!(
            d.initial_backoff(Duration::from_secs(10))
                .max_backoff(Duration::from_secs(1))
                .validate(),
            Err(InvalidInput::Inconsistent(_))
        ));
    }

    #[test]
    fn jitter_unit_is_in_range_and_varies() {
        let draws: Vec<f64> = (0..64).map(|_| jitter_unit(AttemptId::new())).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn policy() -> impl Strategy<Value = RetryPolicy> {
            (1u64..60_000, 1u64..600_000, 1.0f64..10.0, 0.0f64..=1.0).prop_map(|(init, max, mult, jit)| {
                RetryPolicy::default()
                    .initial_backoff(Duration::from_millis(init.min(max)))
                    .max_backoff(Duration::from_millis(max))
                    .multiplier(mult)
                    .jitter(jit)
            })
        }

        proptest! {
            #[test]
            fn never_above_the_cap(p in policy(), attempt in 1u32..200, unit in 0.0f64..1.0) {
                prop_assert!(p.delay(attempt, unit) <= p.max_backoff);
            }

            #[test]
            fn never_negative_and_within_the_jitter_band(p in policy(), attempt in 1u32..200, unit in 0.0f64..1.0) {
                let base = p.base_delay(attempt).as_secs_f64();
                let got = p.delay(attempt, unit).as_secs_f64();
                let low = base * (1.0 - p.jitter);
                let high = (base * (1.0 + p.jitter)).min(p.max_backoff.as_secs_f64());
                prop_assert!(got >= 0.0);
                // Nanosecond rounding of Duration::from_secs_f64.
                prop_assert!(got >= low.min(high) - 1e-9, "{got} < {low}");
                prop_assert!(got <= high + 1e-9, "{got} > {high}");
            }

            #[test]
            fn monotone_without_jitter(p in policy(), attempt in 1u32..200) {
                let p = p.jitter(0.0);
                prop_assert!(p.delay(attempt, 0.7) <= p.delay(attempt + 1, 0.7));
            }

            #[test]
            fn base_delay_starts_at_initial(p in policy()) {
                prop_assert_eq!(p.base_delay(1), p.initial_backoff.min(p.max_backoff));
            }
        }
    }
}
