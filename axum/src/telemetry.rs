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

use std::fmt::Display;
use std::io::IsTerminal;
use std::process::ExitCode;

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

/// A service's `main` in one call: [`init`], each of `warnings` logged
/// (`taskfence::config::startup_warnings`), `service` run and its error
/// logged, then the last spans exported off the runtime's threads (as
/// [`Telemetry::shutdown`] needs). Why: every service's binary ends this
/// way, and an exporter shut down on a runtime thread, or not at all, loses
/// the spans of the very failure that stopped the service.
///
/// `ExitCode::FAILURE` when the exporter cannot be built (said on stderr,
/// nothing run) or `service` fails (logged at error level), `SUCCESS` when
/// it returns `Ok`.
///
/// ```no_run
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
///     taskfence_axum::telemetry::run("my-service", endpoint.as_deref(), Vec::new(), async {
///         // … connect, start, wait for a signal, drain …
///         Ok::<(), String>(())
///     })
///     .await
/// }
/// ```
///
/// # Panics
///
/// When a global subscriber is installed already.
pub async fn run<E: Display>(
    service_name: &'static str,
    otlp_endpoint: Option<&str>,
    warnings: Vec<String>,
    service: impl Future<Output = Result<(), E>>,
) -> ExitCode {
    let telemetry = match init(service_name, otlp_endpoint) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("{service_name}: {error}");
            return ExitCode::FAILURE;
        }
    };
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let code = match service.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::FAILURE
        }
    };
    // The exporter's client blocks: off the runtime's threads.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn run_with_an_unusable_endpoint_fails_before_running_the_service() {
        let ran = std::sync::atomic::AtomicBool::new(false);
        let service = async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), String>(())
        };
        let code = run("test", Some("not a url"), Vec::new(), service).await;
        assert_eq!(code, ExitCode::FAILURE);
        assert!(!ran.into_inner(), "nothing runs without its telemetry");
    }

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
