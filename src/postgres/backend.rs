//! The one implementation of [`Backend`] and [`InspectBackend`] on
//! PostgreSQL, for any [`Site`]: [`PgStore`](super::PgStore) (the pool) and
//! [`PgConnStore`](super::PgConnStore) (the caller's connection) run the same
//! code, one [`ops`] function per operation.

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

use super::site::Site;
use super::{ops, reads};

#[async_trait]
impl<S: Site> Backend for S {
    async fn submit(&self, mut task: NewTask) -> Result<Submitted> {
        task.handoff &= self.handoffs();
        ops::submit(self.sql(), &mut *self.conn().await?, task).await
    }

    async fn submit_many(&self, mut tasks: Vec<NewTask>) -> Result<Vec<Result<Submitted>>> {
        let handoffs = self.handoffs();
        tasks.iter_mut().for_each(|task| task.handoff &= handoffs);
        ops::submit_many(self.sql(), &mut *self.conn().await?, tasks).await
    }

    async fn get(&self, id: TaskId) -> Result<Option<Task>> {
        ops::get(self.sql(), &mut *self.conn().await?, id).await
    }

    async fn find(&self, key: &RequestKey) -> Result<Option<Task>> {
        ops::find(self.sql(), &mut *self.conn().await?, key).await
    }

    async fn claim(&self, id: TaskId, request: ClaimRequest) -> Result<Claim> {
        ops::claim(self.sql(), &mut *self.conn().await?, id, request).await
    }

    async fn renew(&self, lease: &mut Lease, extend_by: Duration) -> Result<Fenced<()>> {
        ops::renew(self.sql(), &mut *self.conn().await?, lease, extend_by).await
    }

    async fn complete(&self, lease: Lease, response: Response) -> Result<Fenced<Task>> {
        ops::complete(self.sql(), &mut *self.conn().await?, lease, response).await
    }

    async fn fail(&self, lease: Lease, failure: Failure) -> Result<Fenced<Retry>> {
        ops::fail(self.sql(), &mut *self.conn().await?, lease, failure).await
    }

    async fn release(&self, lease: Lease) -> Result<Fenced<()>> {
        ops::release(self.sql(), &mut *self.conn().await?, lease, Work::Started).await
    }

    async fn release_unstarted(&self, lease: Lease) -> Result<Fenced<()>> {
        ops::release(self.sql(), &mut *self.conn().await?, lease, Work::NotStarted).await
    }

    async fn cancel(&self, id: TaskId, reason: &str) -> Result<Fenced<Task>> {
        ops::cancel(self.sql(), &mut *self.conn().await?, id, reason).await
    }

    async fn record_operation(&self, lease: &Lease, operation_id: &str) -> Result<Fenced<()>> {
        ops::record_operation(self.sql(), &mut *self.conn().await?, lease, operation_id).await
    }

    async fn attempts(&self, id: TaskId) -> Result<Vec<Attempt>> {
        ops::attempts(self.sql(), &mut *self.conn().await?, id).await
    }

    async fn begin_effect(&self, lease: &Lease, name: &str) -> Result<Fenced<EffectStart>> {
        ops::begin_effect(self.sql(), &mut *self.conn().await?, lease, name).await
    }

    async fn finish_effect(
        &self,
        lease: &Lease,
        name: &str,
        outcome: EffectOutcome,
    ) -> Result<Fenced<Effect>> {
        ops::finish_effect(self.sql(), &mut *self.conn().await?, lease, name, &outcome).await
    }

    async fn effects(&self, id: TaskId) -> Result<Vec<Effect>> {
        ops::effects(self.sql(), &mut *self.conn().await?, id).await
    }

    async fn reopen(&self, id: TaskId, request: ReopenRequest) -> Result<Fenced<Task>> {
        ops::reopen(self.sql(), &mut *self.conn().await?, id, request).await
    }

    async fn due(&self, limit: usize) -> Result<Vec<TaskId>> {
        ops::due(self.sql(), &mut *self.conn().await?, limit).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        ops::purge_expired(self.sql(), &mut *self.conn().await?, limit).await
    }

    async fn claim_many(&self, ids: &[TaskId], request: ClaimRequest) -> Result<Vec<Claim>> {
        ops::claim_many(self.sql(), &mut *self.conn().await?, ids, request).await
    }

    async fn complete_many(&self, completions: Vec<(Lease, Response)>) -> Result<Vec<Result<Fenced<Task>>>> {
        ops::complete_many(self.sql(), &mut *self.conn().await?, completions).await
    }

    async fn claim_next(&self, request: ClaimNext) -> Result<Vec<Lease>> {
        ops::claim_next(self.sql(), &mut *self.conn().await?, request).await
    }

    async fn renew_many(&self, leases: &mut [Lease], extend_by: Duration) -> Result<Vec<Fenced<()>>> {
        ops::renew_many(self.sql(), &mut *self.conn().await?, leases, extend_by).await
    }

    fn decides_limits(&self) -> bool {
        true
    }

    async fn define_bucket(&self, bucket: RateBucket) -> Result<()> {
        ops::define_bucket(self.sql(), &mut *self.conn().await?, &bucket).await
    }

    async fn drain_bucket(&self, name: &str, retry_after: Duration) -> Result<Option<BucketState>> {
        ops::drain_bucket(self.sql(), &mut *self.conn().await?, name, retry_after).await
    }
}

/// Runs one operator's read: on the pool, in a transaction of its own under
/// the store's statement timeout ([`reads`]); on the caller's connection, as
/// it is.
macro_rules! bounded {
    ($site:expr, |$sql:ident, $conn:ident| $read:expr) => {{
        let site = $site;
        let mut held = site.conn().await?;
        let $sql = site.sql();
        match site.read_timeout() {
            Some(limit) => {
                let mut tx = reads::begin(&mut held, limit).await?;
                let answer = {
                    let $conn: &mut sqlx::PgConnection = &mut tx;
                    $read.await
                };
                reads::finish(tx, answer, limit).await
            }
            None => {
                let $conn: &mut sqlx::PgConnection = &mut held;
                $read.await
            }
        }
    }};
}

#[async_trait]
impl<S: Site> InspectBackend for S {
    async fn list(&self, query: &TaskQuery) -> Result<Page> {
        bounded!(self, |sql, conn| ops::list(sql, conn, query))
    }

    async fn counts(&self, scope: Option<&str>) -> Result<Counts> {
        bounded!(self, |sql, conn| ops::counts(sql, conn, scope))
    }

    async fn counts_up_to(&self, scope: Option<&str>, cap: u64) -> Result<CappedCounts> {
        bounded!(self, |sql, conn| reads::counts_up_to(sql, conn, scope, cap))
    }

    async fn story(&self, id: TaskId) -> Result<Option<Story>> {
        bounded!(self, |sql, conn| ops::story(sql, conn, id))
    }

    async fn depth(&self) -> Result<Vec<QueueDepth>> {
        bounded!(self, |sql, conn| ops::depth(sql, conn))
    }

    async fn stranded(&self, older_than: Duration, limit: usize) -> Result<Vec<TaskSummary>> {
        bounded!(self, |sql, conn| ops::stranded(sql, conn, older_than, limit))
    }

    async fn buckets(&self) -> Result<Vec<BucketState>> {
        bounded!(self, |sql, conn| ops::buckets(sql, conn))
    }

    async fn concurrency(&self, key: &str) -> Result<KeySlots> {
        bounded!(self, |sql, conn| ops::concurrency(sql, conn, key))
    }
}
