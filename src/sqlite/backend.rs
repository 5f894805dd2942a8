//! The one implementation of [`Backend`] and [`InspectBackend`] on SQLite,
//! for either [`Site`]: [`SqliteStore`](super::SqliteStore) (the pool) and
//! [`SqliteConnStore`](super::SqliteConnStore) (the caller's connection)
//! run the same code, one [`ops`] function per operation, each in a
//! transaction of its own (or a savepoint of the caller's) by [`run!`].

use std::time::Duration;

use async_trait::async_trait;

use crate::backend::rules::Work;
use crate::backend::{Backend, InspectBackend};
use crate::effect::{Effect, EffectOutcome, EffectStart};
use crate::error::Result;
use crate::inspect::{CappedCounts, Counts, Page, QueueDepth, Story, TaskQuery, TaskSummary};
use crate::policy::Failure;
use crate::store::{Attempt, Claim, ClaimNext, ClaimRequest, Fenced, Lease, ReopenRequest, Retry, Submitted};
use crate::task::{NewTask, RequestKey, Response, Task, TaskId};
use crate::throttle::{BucketState, KeySlots, RateBucket};

use super::ops;
use super::site::{Site, run};
use super::{SqliteConnStore, SqliteStore};

/// The implementation for one site type. (A blanket `impl<S: Site>` would
/// overlap PostgreSQL's, which the compiler cannot tell apart.)
macro_rules! implement {
    ($site:ty) => {
        #[async_trait]
        impl Backend for $site {
            async fn submit(&self, mut task: NewTask) -> Result<Submitted> {
                task.handoff &= self.store().handoffs;
                run!(self, Write, |conn, now| ops::submit(
                    conn,
                    now,
                    task.clone()
                ))
            }

            async fn submit_many(&self, mut tasks: Vec<NewTask>) -> Result<Vec<Result<Submitted>>> {
                let handoffs = self.store().handoffs;
                tasks.iter_mut().for_each(|task| task.handoff &= handoffs);
                run!(self, Write, |conn, now| ops::submit_many(
                    conn,
                    now,
                    tasks.clone()
                ))
            }

            async fn get(&self, id: TaskId) -> Result<Option<Task>> {
                run!(self, Read, |conn, _now| ops::get(conn, id))
            }

            async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
                run!(self, Read, |conn, _now| ops::find(conn, key))
            }

            async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
                run!(self, Write, |conn, now| ops::claim(conn, now, id, &request))
            }

            async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
                run!(self, Write, |conn, now| ops::renew(
                    conn, now, lease, extend_by
                ))
            }

            async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
                run!(self, Write, |conn, now| ops::complete(
                    conn,
                    now,
                    &lease,
                    response.clone()
                ))
            }

            async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
                run!(self, Write, |conn, now| ops::fail(
                    conn,
                    now,
                    &lease,
                    failure.clone()
                ))
            }

            async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
                run!(self, Write, |conn, now| ops::release(
                    conn,
                    now,
                    &lease,
                    Work::Started
                ))
            }

            async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
                run!(self, Write, |conn, now| ops::release(
                    conn,
                    now,
                    &lease,
                    Work::NotStarted
                ))
            }

            async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
                run!(self, Write, |conn, now| ops::cancel(conn, now, id, reason))
            }

            async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
                run!(self, Write, |conn, now| ops::record_operation(
                    conn,
                    now,
                    lease,
                    operation_id
                ))
            }

            async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
                run!(self, Read, |conn, _now| ops::attempts(conn, id))
            }

            async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
                run!(self, Write, |conn, now| ops::begin_effect(
                    conn, now, lease, name
                ))
            }

            async fn finish_effect(
                &self,
                lease: &Lease,
                name: &str,
                outcome: EffectOutcome,
            ) -> Result<Fenced<Effect>> {
                run!(self, Write, |conn, now| ops::finish_effect(
                    conn, now, lease, name, &outcome
                ))
            }

            async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
                run!(self, Read, |conn, _now| ops::effects(conn, id))
            }

            async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
                run!(self, Write, |conn, now| ops::reopen(
                    conn,
                    now,
                    id,
                    request.clone()
                ))
            }

            async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
                run!(self, Read, |conn, now| ops::due(conn, now, limit))
            }

            async fn purge_expired(&self, limit: usize) -> Result<u64> {
                run!(self, Write, |conn, now| ops::purge_expired(
                    conn, now, limit
                ))
            }

            async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
                run!(self, Write, |conn, now| ops::claim_many(
                    conn, now, ids, &request
                ))
            }

            async fn complete_many(
                &self,
                completions: Vec<(Lease, Response)>,
            ) -> Result<Vec<Result<Fenced<Task>>>> {
                run!(self, Write, |conn, now| ops::complete_many(
                    conn,
                    now,
                    completions.clone()
                ))
            }

            async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
                run!(self, Write, |conn, now| ops::claim_next(
                    conn, now, &request
                ))
            }

            fn decides_limits(&self) -> bool {
                true
            }

            async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
                run!(self, Write, |conn, _now| ops::define_bucket(conn, &bucket))
            }

            async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
                run!(self, Write, |conn, now| ops::drain_bucket(
                    conn,
                    now,
                    name,
                    retry_after
                ))
            }

            async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
                run!(self, Write, |conn, now| ops::renew_many(
                    conn, now, leases, extend_by
                ))
            }
        }

        #[async_trait]
        impl InspectBackend for $site {
            async fn list(&self, query: &TaskQuery) -> Result<Page> {
                run!(self, Read, |conn, _now| ops::list(conn, query))
            }

            async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
                run!(self, Read, |conn, _now| ops::counts(conn, scope))
            }

            async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
                run!(self, Read, |conn, _now| ops::counts_up_to(conn, scope, cap))
            }

            async fn story(&self, id: TaskId) -> Result<Option<Story>> {
                run!(self, Read, |conn, _now| ops::story(conn, id))
            }

            async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
                run!(self, Read, |conn, now| ops::stranded(
                    conn, now, older_than, limit
                ))
            }

            async fn depth(&self) -> Result<Vec<QueueDepth>> {
                run!(self, Read, |conn, now| ops::depth(conn, now))
            }

            async fn buckets(&self) -> Result<Vec<BucketState>> {
                run!(self, Read, |conn, _now| ops::buckets(conn))
            }

            async fn concurrency(&self, key: &str) -> Result<KeySlots> {
                run!(self, Read, |conn, now| ops::concurrency(conn, now, key))
            }
        }
    };
}

implement!(SqliteStore);
implement!(SqliteConnStore<'_>);
