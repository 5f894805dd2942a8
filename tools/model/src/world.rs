//! The small world the checker explores: its configuration, its state (the
//! store's real `Task` and `Effect` records, the queue, the workers and
//! their leases, the client's script, the operator) and the actions.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use taskfence::effect::Effect;
use taskfence::policy::{AcceptanceRule, FailureKind, OnAmbiguous};
use taskfence::task::AttemptId;
use taskfence::{InputHash, Lease, RequestKey, Response, RetryPolicy, Task, TaskId};
use time::OffsetDateTime;

/// The one external effect every task's work makes.
pub(crate) const EFFECT: &str = "notify";

/// One tick of the store's clock.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// What a world is made of and how far it is explored.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Workers per consumer process (a process crashes, stops and group-commits as one).
    pub(crate) processes: Vec<u8>,
    /// The client's submissions, each made once, in any order: (request key, input).
    pub(crate) script: Vec<(u8, u8)>,
    /// The acceptance rule of every task.
    pub(crate) acceptance: AcceptanceRule,
    /// The policy after an ambiguous failure or an effect left intended.
    pub(crate) on_ambiguous: OnAmbiguous,
    /// Attempts per budget.
    pub(crate) max_attempts: u32,
    /// Ticks per lease (and per renewal).
    pub(crate) lease: u8,
    /// Ticks of the first backoff (doubled, capped at `max_backoff`).
    pub(crate) backoff: u8,
    /// Cap on a backoff, in ticks.
    pub(crate) max_backoff: u8,
    /// Ticks the dedup record is kept.
    pub(crate) retention: u8,
    /// The elapsed-time budget, in ticks.
    pub(crate) deadline: Option<u8>,
    /// Up to this tick every actor acts, faults included.
    pub(crate) horizon: u8,
    /// Ticks after the horizon during which only fair steps run (so the
    /// liveness property can see every task finish).
    pub(crate) slack: u8,
    /// How many reopenings the operator may make.
    pub(crate) reopens: u8,
    /// How many cancellations the operator may make.
    pub(crate) cancels: u8,
    /// How many claims the workers may give back unstarted (each costs no
    /// attempt, so without a bound the versions would grow for ever).
    pub(crate) unstarted: u8,
    /// Whether the work makes the external effect.
    pub(crate) effects: bool,
    /// Whether the queue may lose a message (the dispatcher then republishes due tasks).
    pub(crate) lossy_queue: bool,
    /// Whether a group commit's answer may be lost.
    pub(crate) lost_acks: bool,
}

impl Config {
    pub(crate) fn workers(&self) -> usize {
        self.processes.iter().map(|&n| n as usize).sum()
    }

    /// The process worker `w` runs in.
    pub(crate) fn process_of(&self, w: usize) -> usize {
        let mut first = 0;
        for (p, &n) in self.processes.iter().enumerate() {
            first += n as usize;
            if w < first {
                return p;
            }
        }
        unreachable!("worker {w} out of range")
    }

    pub(crate) fn policy(&self) -> RetryPolicy {
        let policy = RetryPolicy::default()
            .max_attempts(self.max_attempts)
            .initial_backoff(ticks(self.backoff))
            .max_backoff(ticks(self.max_backoff))
            .multiplier(2.0)
            .jitter(0.0)
            .on_ambiguous(self.on_ambiguous);
        match self.deadline {
            Some(d) => policy.deadline(ticks(d)),
            None => policy,
        }
    }
}

pub(crate) fn ticks(n: u8) -> Duration {
    TICK * u32::from(n)
}

/// The store's instant at `tick`.
pub(crate) fn at(tick: u8) -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + time::Duration::days(20_000) + ticks(tick)
}

/// The tick of an instant (for printing).
pub(crate) fn tick_of(t: OffsetDateTime) -> i64 {
    (t - at(0)).whole_seconds()
}

/// The id of the `n`th task the store creates.
pub(crate) fn task_id(n: u8) -> TaskId {
    TaskId::from_uuid(uuid::Uuid::from_u128(0x7a5f_0000 + u128::from(n)))
}

/// The task number of an id made by [`task_id`].
pub(crate) fn number(id: TaskId) -> u8 {
    (id.as_uuid().as_u128() - 0x7a5f_0000) as u8
}

/// The attempt id of assignment `version` of task `n`: deterministic, so
/// states that differ only by a random id are one state.
pub(crate) fn attempt_id(n: u8, version: u64) -> AttemptId {
    AttemptId::from_uuid(uuid::Uuid::from_u128((u128::from(n) << 64) | u128::from(version)))
}

pub(crate) fn request_key(key: u8) -> RequestKey {
    RequestKey::new("s", "op", format!("k{key}"))
}

pub(crate) fn input(input: u8) -> InputHash {
    InputHash::of([[input]])
}

/// The response an assignment's work produces: it names the assignment, so
/// the saved one says who saved it.
pub(crate) fn response(version: u64) -> Response {
    Response::from(format!("v{version}"))
}

/// How far a worker's work has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Work {
    /// Claimed, the work not begun yet (a prefetched task): it may still be
    /// given back unstarted, and then its claim costs no attempt.
    Claimed,
    /// Running the work, the effect not begun.
    Started,
    /// The effect's intent is recorded; the provider not called yet.
    Intended,
    /// The provider was called (`ok`: it acted); the outcome not recorded.
    Called { ok: bool },
    /// The effect is settled (done): the work can finish.
    Settled,
    /// `begin_effect` answered stop (an earlier intent with no outcome,
    /// under `OnAmbiguous::Stop`): the worker must fail the attempt.
    MustStop,
}

/// A worker slot of a consumer process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Worker {
    Idle,
    /// Holds `lease` and runs the work.
    Holding {
        lease: Lease,
        work: Work,
    },
    /// Its completion waits in the process's group-commit buffer.
    Committing {
        lease: Lease,
    },
    /// Its completion was sent and the answer lost: it asks again.
    Unsure {
        lease: Lease,
    },
}

/// What the checker remembers beside the store, per task number: the
/// history the invariants judge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ghost {
    /// Completions the store accepted.
    pub(crate) saves: u8,
    /// The assignment whose completion a worker heard was saved.
    pub(crate) reported: Option<u64>,
    /// Calls to the provider with the effect's key.
    pub(crate) calls: u8,
    /// Provider calls whose failure was recorded (certainly not made).
    pub(crate) failed_calls: u8,
    /// Purged: the record is gone, a replay is new work.
    pub(crate) purged: bool,
    /// Claims the current budget counts: every claim granted since the
    /// budget began, less those given back unstarted by the current, live
    /// lease's holder (a claim whose work began, or whose lease was lost
    /// while held, stays counted).
    pub(crate) counted: u8,
}

/// The whole world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct World {
    pub(crate) tick: u8,
    /// The store's tasks, in creation order (task number = position ever created).
    pub(crate) tasks: Vec<Task>,
    /// The store's effect journal (one effect per task at most).
    pub(crate) effects: Vec<Effect>,
    /// Tasks created so far (the next task number).
    pub(crate) created: u8,
    /// Task numbers with a message in the queue (a bit each). A receive
    /// leaves the message: any worker may get it again (redelivery,
    /// duplicates) until one deletes it.
    pub(crate) queue: u8,
    pub(crate) workers: Vec<Worker>,
    /// Workers per process (from the configuration).
    pub(crate) sizes: Vec<u8>,
    /// Script entries submitted, in order (a client retries after its first try).
    pub(crate) submitted: u8,
    pub(crate) reopens: u8,
    pub(crate) cancels: u8,
    /// Unstarted releases left.
    pub(crate) unstarted: u8,
    pub(crate) ghost: Vec<Ghost>,
}

impl World {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            tick: 0,
            tasks: Vec::new(),
            effects: Vec::new(),
            created: 0,
            queue: 0,
            workers: vec![Worker::Idle; config.workers()],
            sizes: config.processes.clone(),
            submitted: 0,
            reopens: config.reopens,
            cancels: config.cancels,
            unstarted: config.unstarted,
            ghost: vec![Ghost::default(); config.script.len()],
        }
    }

    pub(crate) fn now(&self) -> OffsetDateTime {
        at(self.tick)
    }

    pub(crate) fn task(&self, n: u8) -> Option<&Task> {
        self.tasks.iter().find(|t| number(t.id) == n)
    }

    pub(crate) fn task_mut(&mut self, n: u8) -> Option<&mut Task> {
        self.tasks.iter_mut().find(|t| number(t.id) == n)
    }

    pub(crate) fn effect(&self, n: u8) -> Option<&Effect> {
        self.effects.iter().find(|e| number(e.task_id) == n)
    }

    pub(crate) fn has_message(&self, n: u8) -> bool {
        self.queue & (1 << n) != 0
    }
}

/// A step one actor takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// The store's clock advances one tick.
    Tick,
    /// The client makes script entry `i` (the next one).
    Submit(u8),
    /// Worker `w` receives task `n`'s message and claims it.
    Receive {
        w: u8,
        n: u8,
    },
    /// Worker `w` claims the oldest task that needs a worker (the store as the queue).
    ClaimNext {
        w: u8,
    },
    Renew {
        w: u8,
    },
    BeginEffect {
        w: u8,
    },
    /// The provider acts (`ok`) or fails for certain, with the key the worker passes.
    CallProvider {
        w: u8,
        ok: bool,
    },
    FinishEffect {
        w: u8,
    },
    /// The work function returns: its completion joins the process's group commit.
    Finish {
        w: u8,
    },
    /// Process `p`'s group commit: every buffered completion, each fenced alone;
    /// with `lost`, the store applies them and the answers are lost.
    Flush {
        p: u8,
        lost: bool,
    },
    /// A worker unsure of its completion asks again.
    Recomplete {
        w: u8,
    },
    Fail {
        w: u8,
        kind: FailureKind,
    },
    /// The worker fails its attempt because `begin_effect` said stop.
    GiveUp {
        w: u8,
    },
    /// The work of worker `w`'s claim begins.
    Begin {
        w: u8,
    },
    Release {
        w: u8,
    },
    /// Worker `w` gives its claim back before the work began
    /// (`release_unstarted`: a prefetched task at a stop, a claim declined).
    ReleaseUnstarted {
        w: u8,
    },
    /// Process `p` stops gracefully (its buffer flushed, held leases
    /// released, claims not begun given back unstarted) and starts again.
    Stop {
        p: u8,
    },
    /// Process `p` crashes (leases and buffer lost) and starts again.
    Crash {
        p: u8,
    },
    Cancel {
        n: u8,
    },
    Reopen {
        n: u8,
    },
    Purge,
    /// The queue loses task `n`'s message.
    Drop {
        n: u8,
    },
    /// The dispatcher republishes every task that needs a worker.
    Redispatch,
}

// The fingerprint: every field a rule, an invariant or a later step reads.
// (Instants the rules never read, such as `finished_at`, and messages are
// left out: states that differ only there are one state.)
impl Hash for World {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.tick.hash(h);
        for task in &self.tasks {
            hash_task(task, h);
        }
        for effect in &self.effects {
            (
                number(effect.task_id),
                effect.state,
                effect.version,
                effect.ambiguous,
            )
                .hash(h);
            effect.key.hash(h);
        }
        (
            self.created,
            self.queue,
            self.submitted,
            self.reopens,
            self.cancels,
            self.unstarted,
        )
            .hash(h);
        // Processes of one size are interchangeable: the fingerprint takes
        // the set of their states, not their order (symmetry reduction).
        let mut processes: Vec<(usize, u64)> = Vec::new();
        let mut first = 0;
        for &size in &self.sizes {
            let mut p = std::collections::hash_map::DefaultHasher::new();
            for worker in &self.workers[first..first + usize::from(size)] {
                hash_worker(worker, &mut p);
            }
            first += usize::from(size);
            processes.push((usize::from(size), p.finish()));
        }
        processes.sort_unstable();
        processes.hash(h);
        self.ghost.hash(h);
    }
}

fn hash_worker<H: Hasher>(worker: &Worker, h: &mut H) {
    match worker {
        Worker::Idle => 0u8.hash(h),
        Worker::Holding { lease, work } => {
            1u8.hash(h);
            hash_lease(lease, h);
            work.hash(h);
        }
        Worker::Committing { lease } => {
            2u8.hash(h);
            hash_lease(lease, h);
        }
        Worker::Unsure { lease } => {
            3u8.hash(h);
            hash_lease(lease, h);
        }
    }
}

fn hash_task<H: Hasher>(task: &Task, h: &mut H) {
    (number(task.id), task.status, task.version, task.budget_base).hash(h);
    (
        task.lease_until,
        task.not_before,
        task.budget_started_at,
        task.expires_at,
        task.created_at,
    )
        .hash(h);
    task.response.hash(h);
    task.input_hash.hash(h);
}

fn hash_lease<H: Hasher>(lease: &Lease, h: &mut H) {
    (number(lease.task_id()), lease.version(), lease.expires_at()).hash(h);
    // The worker's copy of the task, as the claim returned it.
    hash_task(lease.task(), h);
}
