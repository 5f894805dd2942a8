//! Logs, and traces when a collector is configured. Logs go to stderr as
//! before; with `--otlp-endpoint` (`OTEL_EXPORTER_OTLP_ENDPOINT`) every span
//! is also exported over OTLP/HTTP, so one request's trace runs from the
//! handler's span (`taskfence_axum::trace::request_span`) through the task submission into
//! the worker's `process` span: taskfence stores the submitter's trace
//! context with the task (its `opentelemetry` feature) and the consumer
//! joins it.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer as _};

/// What [`init`] set up; [`Telemetry::shutdown`] sends the spans still buffered.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber: logs filtered by `RUST_LOG` (default
/// `info`), plus spans exported to `otlp_endpoint` when there is one.
pub fn init(otlp_endpoint: Option<&str>) -> Result<Telemetry, String> {
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log collector gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let Some(endpoint) = otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter for {endpoint}: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("chat-api").build())
        .build();
    // The app's spans and taskfence's store calls (DEBUG), not the HTTP
    // client's the exporter itself runs on.
    let traces = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("chat-api"))
        .with_filter(EnvFilter::new(
            "info,taskfence=debug,reqwest=off,hyper=off,hyper_util=off",
        ));
    tracing_subscriber::registry().with(logs).with(traces).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

impl Telemetry {
    /// Exports what is still buffered (at a stop), then stops exporting.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("chat-api: exporting the last traces failed: {e}");
        }
    }
}
