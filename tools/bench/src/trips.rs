//! Round trips and statements per operation, counted on the wire.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;
use taskfence::{Claim, ClaimRequest, Failure, Lease, PgStore, Response, TaskStore};

use crate::completion::textbook;
use crate::db::{BenchSchema, LEASE, RESPONSE, Raw};
use crate::lifecycle::{fresh_key, new_task};
use crate::report::Report;
use crate::{Config, Res};
use taskfence_test_support::{Wire, WireProxy};

/// Waits until the pool's connection is back (sqlx pings it on release,
/// after the operation returned), so that ping is counted with its operation.
async fn settle(pool: &PgPool) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.num_idle() < pool.size() as usize {
        if Instant::now() > deadline {
            return Err("the pooled connection did not come back".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

async fn acquire(store: &PgStore) -> Res<Lease> {
    let task = store.submit(new_task(&fresh_key("t"))).await?.into_task();
    match store.claim(task.id, ClaimRequest::new("w", LEASE)).await? {
        Claim::Acquired(lease) => Ok(lease),
        other => Err(format!("claim of a fresh task: {other:?}").into()),
    }
}

/// Every operation once; `seen(name)` after each, with the pool settled.
async fn sequence(
    store: &PgStore,
    raw: &Raw,
    schema: &BenchSchema,
    pool: &PgPool,
    counter: &WireProxy,
) -> Res<Vec<(&'static str, Wire)>> {
    let mut out = Vec::new();
    let mut seen = async |name: &'static str| -> Res<()> {
        settle(pool).await?;
        out.push((name, counter.take()));
        Ok(())
    };
    settle(pool).await?;
    counter.take();
    let task = store.submit(new_task(&fresh_key("t"))).await?.into_task();
    seen("submit").await?;
    let mut lease = match store.claim(task.id, ClaimRequest::new("w", LEASE)).await? {
        Claim::Acquired(lease) => lease,
        other => return Err(format!("claim: {other:?}").into()),
    };
    seen("claim").await?;
    store.renew(&mut lease, LEASE).await?.into_result()?;
    seen("renew").await?;
    store.record_operation(&lease, "op-1").await?.into_result()?;
    seen("record_operation").await?;
    store
        .complete(lease, Response::new(RESPONSE.to_vec()))
        .await?
        .into_result()?;
    seen("complete").await?;
    let lease = acquire(store).await?;
    settle(pool).await?;
    counter.take();
    store
        .fail(lease, Failure::retryable("429"))
        .await?
        .into_result()?;
    seen("fail").await?;
    let lease = acquire(store).await?;
    settle(pool).await?;
    counter.take();
    let released = lease.task_id();
    store.release(lease).await?.into_result()?;
    seen("release").await?;
    // The released attempt is in the row: this claim moves it to the journal.
    match store.claim(released, ClaimRequest::new("w", LEASE)).await? {
        Claim::Acquired(_) => {}
        other => return Err(format!("claim after a release: {other:?}").into()),
    }
    seen("claim replacing an attempt").await?;
    store.due(100).await?;
    seen("due").await?;
    store.purge_expired(100).await?;
    seen("purge_expired").await?;
    let lease = acquire(store).await?;
    let select = format!("SELECT id FROM {}.tasks WHERE id = $1 FOR UPDATE", schema.q());
    let update = schema.statement("complete_current");
    settle(pool).await?;
    counter.take();
    textbook(pool, &select, &update, &lease).await?;
    seen("textbook completion").await?;
    let key = fresh_key("raw");
    let id = raw.submit(pool, &key).await?;
    seen("ceiling: submit").await?;
    let version = raw.claim(pool, id).await?;
    seen("ceiling: claim").await?;
    raw.complete(pool, id, version).await?;
    seen("ceiling: complete").await?;
    Ok(out)
}

pub(crate) async fn run(cfg: &Config, pool: &PgPool, report: &mut Report) -> Res<()> {
    let schema = BenchSchema::create(cfg, pool).await?;
    let counter = WireProxy::start_with(cfg.url.parse()?).await;
    // One connection (TLS off so the proxy can read the protocol), no
    // acquire-time ping, as for the benchmarked pools.
    let counted = counter.pool(1).await;
    let store = PgStore::builder(counted.clone()).schema(schema.name()).build()?;
    let raw = Raw::new(&schema);
    // The first pass prepares every statement on the connection (a Parse
    // round trip the first time only); the second is the one reported.
    sequence(&store, &raw, &schema, &counted, &counter).await?;
    let counts = sequence(&store, &raw, &schema, &counted, &counter).await?;
    report.section(
        "Round trips per operation",
        "Counted on the wire by a proxy that parses the PostgreSQL protocol (this server has no \
         `pg_stat_statements`), on a pooled connection whose statements are already prepared. A \
         round trip is a `Sync` after statements (or a simple query) that the client waits on. \
         sqlx also sends a lone `Sync` when a connection goes back to the pool — after the \
         operation has returned, not waited on by it — listed separately as the release ping.",
    );
    let rows = counts
        .iter()
        .map(|(name, w)| {
            vec![
                (*name).to_owned(),
                w.round_trips().to_string(),
                w.statements().to_string(),
                w.pings.to_string(),
            ]
        })
        .collect();
    report.table(&["operation", "round trips", "statements", "release pings"], rows);
    counted.close().await;
    drop(counter);
    drop(schema);
    Ok(())
}
