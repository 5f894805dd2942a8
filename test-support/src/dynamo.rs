//! DynamoDB for the tests: where the endpoint is, clients with static test
//! credentials, fixtures on fresh tables, and a request counter.
//!
//! **One request at a time.** moto's `TransactWriteItems` takes no lock: a
//! cancelled transaction "rolls back" by putting back a copy of the whole
//! table taken before it ran, erasing writes that other requests made
//! meanwhile. DynamoDB itself makes every request atomic (transactions are
//! serializable). So every client made here sends its requests through one
//! process-wide queue ([`one_at_a_time`]): racing operations still interleave
//! request by request — read, then conditional write — exactly the level at
//! which DynamoDB promises atomicity, and moto never runs two at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::StalledStreamProtectionConfig;
use aws_sdk_dynamodb::config::http::HttpRequest;
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use aws_sdk_dynamodb::config::{HttpClient, SharedHttpClient};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
};
use taskfence::testing::DynamoFixture;

use crate::faults::Faults;

/// The DynamoDB endpoint of the tests: `TASKFENCE_DYNAMODB_ENDPOINT`, else
/// `TASKFENCE_SQS_ENDPOINT` (moto serves both from one process).
///
/// # Panics
///
/// When neither is set: a DynamoDB test must not silently pass without one.
pub fn endpoint() -> String {
    std::env::var("TASKFENCE_DYNAMODB_ENDPOINT")
        .or_else(|_| std::env::var("TASKFENCE_SQS_ENDPOINT"))
        .expect("TASKFENCE_DYNAMODB_ENDPOINT (or TASKFENCE_SQS_ENDPOINT) must name a DynamoDB API, e.g. moto_server's http://127.0.0.1:5000")
}

/// A client on [`endpoint`] with static test credentials in `us-east-1`, on
/// its own plain-HTTP connection pool.
pub fn client() -> Client {
    client_with(None)
}

/// [`client`] whose every HTTP request is counted by `counter`.
pub fn counted_client(counter: &RequestCounter) -> Client {
    client_with(Some(counter.clone()))
}

/// [`client`] on `endpoint` rather than [`endpoint`]'s: a DynamoDB API the
/// test found or started itself (e.g. the moto it also uses for SQS). Its
/// requests join the same one-at-a-time queue.
pub fn client_at(endpoint: &str) -> Client {
    client_on(endpoint.to_owned(), None)
}

/// [`client`] with `faults` in front of the wire (see [`Faults`]): what a
/// test of the store's retry paths and interleavings talks through. The
/// SDK's own retries are off, so each injected fault reaches the store
/// exactly where the test put it.
pub fn faulty_client(faults: &Faults) -> Client {
    let faults = faults.clone();
    let serial = one_at_a_time(aws_smithy_http_client::Builder::new().build_http());
    let http = http_client_fn(move |settings, components| {
        faults.connector(serial.http_connector(settings, components))
    });
    let config = base_config(endpoint())
        .http_client(http)
        .retry_config(RetryConfig::disabled());
    Client::from_conf(config.build())
}

fn client_with(counter: Option<RequestCounter>) -> Client {
    client_on(endpoint(), counter)
}

fn client_on(endpoint: String, counter: Option<RequestCounter>) -> Client {
    let mut config =
        base_config(endpoint).http_client(one_at_a_time(aws_smithy_http_client::Builder::new().build_http()));
    if let Some(counter) = counter {
        config = config.interceptor(counter);
    }
    Client::from_conf(config.build())
}

/// Test credentials in `us-east-1` on `endpoint`. Stalled-stream protection
/// is off: a request waiting its turn in the one-at-a-time queue (see the
/// [module documentation](self)) on a busy machine would otherwise trip it
/// (`ThroughputBelowMinimum`) and fail a test that did nothing wrong.
fn base_config(endpoint: String) -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "taskfence-tests"))
        .endpoint_url(endpoint)
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
}

/// Wraps `inner` so that requests from every client of this process are sent
/// one at a time (see the [module documentation](self)).
pub fn one_at_a_time(inner: SharedHttpClient) -> SharedHttpClient {
    static QUEUE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    #[derive(Debug)]
    struct Serial(SharedHttpConnector);
    impl HttpConnector for Serial {
        fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
            let inner = self.0.clone();
            HttpConnectorFuture::new(async move {
                let _turn = QUEUE.lock().await;
                inner.call(request).await
            })
        }
    }
    http_client_fn(move |settings, components| {
        SharedHttpConnector::new(Serial(inner.http_connector(settings, components)))
    })
}

/// A conformance fixture on a fresh table through a new [`client`].
pub async fn fixture() -> DynamoFixture {
    DynamoFixture::new(client()).await
}

/// Counts the HTTP requests a client sends, by DynamoDB operation (the
/// `X-Amz-Target` header): what an operation costs, retries included.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter(Arc<Mutex<BTreeMap<String, u32>>>);

impl RequestCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The requests counted since the last call, by operation, and resets.
    pub fn take(&self) -> BTreeMap<String, u32> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("?")
            .to_owned();
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target)
            .or_default() += 1;
        Ok(())
    }
}

/// A second [`DynamoStore`](taskfence::DynamoStore) on `fixture`'s table, with
/// its own client (its own connection pool) and `clock`: another replica of
/// the service, e.g. with a skewed clock.
pub fn replica(
    fixture: &DynamoFixture,
    clock: impl taskfence::clock::Clock + 'static,
) -> taskfence::DynamoStore {
    taskfence::DynamoStore::builder(client(), fixture.table())
        .clock(clock)
        .build()
        .expect("the fixture's table name is valid")
}
