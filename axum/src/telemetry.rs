//! A service's logs and traces in one call (feature `otlp`): what every
//! service on taskfence sets up the same way, so one request's trace runs
//! from the handler's span ([`trace::request_span`](crate::trace::request_span))
//! through the task's submission into the worker's `process` span
//! (taskfence's `opentelemetry` feature stores the submitter's trace
//! context with the task, and the consumer joins it).
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`), coloured on a
//! terminal only. With a collector's endpoint every span is also exported
//! over OTLP/HTTP (`{endpoint}/v1/traces`): the application's at `INFO`,
//! taskfence's store calls at `DEBUG`, never the HTTP client's the exporter
//! itself runs on.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// What the exported spans are filtered to: the application's and
/// taskfence's (its store calls are `DEBUG`), not the exporter's own client.
pub const TRACE_FILTER: &str = "info,taskfence=debug,reqwest=off,hyper=off,hyper_util=off";

/// The exporter could not be built (an endpoint it cannot use).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the OTLP exporter for {endpoint}: {source}")]
pub struct TelemetryError {
    endpoint: String,
    source: opentelemetry_otlp::ExporterBuildError,
}

/// What [`init`] set up; [`Telemetry::shutdown`] sends the spans still
/// buffered. Without an endpoint it holds nothing.
#[derive(Debug)]
#[must_use = "shut it down at the end, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber: logs on stderr filtered by `RUST_LOG`
/// (default `info`) and, when `otlp_endpoint` is given
/// (`http://127.0.0.1:4318`), spans exported there under `service_name`.
///
/// ```no_run
/// let telemetry = taskfence_axum::telemetry::init("my-service", Some("http://127.0.0.1:4318"))?;
/// // … run the service …
/// # async fn f(telemetry: taskfence_axum::telemetry::Telemetry) {
/// // The exporter sends from its own thread: off the runtime's.
/// tokio::task::spawn_blocking(move || telemetry.shutdown()).await.ok();
/// # }
/// # Ok::<(), taskfence_axum::telemetry::TelemetryError>(())
/// ```
///
/// # Errors
///
/// The exporter cannot be built for `otlp_endpoint` (nothing is installed then).
///
/// # Panics
///
/// When a global subscriber is installed already.
pub fn init(service_name: &'static str, otlp_endpoint: Option<&str>) -> Result<Telemetry, TelemetryError> {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let Some(endpoint) = otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let provider = provider(service_name, endpoint)?;
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service_name))
        .with_filter(EnvFilter::new(TRACE_FILTER));
    tracing_subscriber::registry().with(logs).with(traces).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The batching tracer provider exporting to `endpoint`'s `/v1/traces`.
fn provider(service_name: &'static str, endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()
        .map_err(|source| TelemetryError {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build())
}

impl Telemetry {
    /// Exports what is still buffered, then stops exporting. It blocks (the
    /// exporter's client is blocking): call it off the async runtime's
    /// threads, e.g. in `spawn_blocking`. A failure is written to stderr, the
    /// logger being about to go.
    ///
    /// ```no_run
    /// let telemetry = taskfence_axum::telemetry::init("my-service", None)?;
    /// telemetry.shutdown();
    /// # Ok::<(), taskfence_axum::telemetry::TelemetryError>(())
    /// ```
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("exporting the last traces failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unusable_endpoint_is_refused_with_its_name() {
        let error = provider("test", "not a url").expect_err("no exporter for a non-URL");
        assert!(error.to_string().contains("not a url"), "{error}");
    }

    #[test]
    fn a_collector_endpoint_builds_a_provider() {
        let provider = provider("test", "http://127.0.0.1:4318/").expect("an http endpoint");
        provider.shutdown().ok();
    }
}
