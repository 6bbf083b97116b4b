//! Logging and tracing setup: `tracing` to stderr as pretty text or JSON, and
//! spans exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set
//! (off and free otherwise). W3C trace context is read from gRPC metadata so
//! a caller's trace continues through Switchyard. No key, authorization
//! header or message content is ever put in a field.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{self, FilterExt};
use tracing_subscriber::layer::{Filter, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// Flushes exported spans on drop of the process (call [`Telemetry::shutdown`]).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter (on its own thread: the OTLP client blocks).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = std::thread::spawn(move || provider.shutdown()).join();
        }
    }
}

/// Installs the global subscriber. Call once.
///
/// The log layer sees events only: request and attempt spans exist for the
/// OTLP exporter, so without one they are never created (no fields
/// formatted, no allocation on the hot path); every log line carries its own
/// request id and target fields instead of a span prefix.
pub fn init(format: LogFormat) -> Telemetry {
    let provider = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")
        .and_then(|_| std::thread::spawn(build_provider).join().ok().flatten());
    tracing_subscriber::registry()
        .with(layers(format, provider.as_ref()))
        .init();
    if provider.is_some() {
        tracing::info!("exporting spans over OTLP/HTTP");
    }
    Telemetry { provider }
}

type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The log layer (events only) and, when exporting, the OTLP layer. Only
/// layers that exist: an absent OTLP layer must not enable spans.
fn layers(format: LogFormat, provider: Option<&SdkTracerProvider>) -> Vec<Boxed> {
    // The events-only filter carries `RUST_LOG`'s most verbose level as its
    // hint. Without one the subscriber's hint is unknown, `init` then lets
    // the `log` crate pass every record (TRACE) to the bridge, and each
    // request paid for the trace records of reqwest's retry policy, built
    // and then dropped by the filter (0.7 % of the door's CPU samples).
    let events = || {
        let env = env_filter();
        let events = filter::filter_fn(|meta| meta.is_event());
        let events = match Filter::<tracing_subscriber::Registry>::max_level_hint(&env) {
            Some(level) => events.with_max_level_hint(level),
            None => events,
        };
        env.and(events)
    };
    let log: Boxed = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(events())
            .boxed(),
        LogFormat::Pretty => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(events())
            .boxed(),
    };
    let mut layers = vec![log];
    if let Some(p) = provider {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("switchyard"))
                .with_filter(env_filter())
                .boxed(),
        );
    }
    layers
}

/// `RUST_LOG`, or `info`; the HNSW crate's INFO lines (five per new index)
/// at `warn` unless `RUST_LOG` names it.
fn env_filter() -> tracing_subscriber::EnvFilter {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let spec = if spec.contains("hnsw_rs") {
        spec
    } else {
        format!("{spec},hnsw_rs=warn")
    };
    tracing_subscriber::EnvFilter::try_new(&spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hnsw_rs=warn"))
}

/// The OTLP/HTTP exporter (it reads the standard OTEL_* variables itself).
fn build_provider() -> Option<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| eprintln!("warning: OTLP exporter disabled: {e}"))
        .ok()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("switchyard")
        .build();
    Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    )
}

/// Reads W3C `traceparent` / `tracestate` from gRPC metadata.
struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The W3C trace context an HTTP caller sent (`traceparent`, with its
/// `tracestate`), the only headers [`continue_trace`] reads; `None` without
/// a `traceparent` (copying every header of every request cost two
/// allocations).
pub fn trace_context(headers: &http::HeaderMap) -> Option<tonic::metadata::MetadataMap> {
    let parent = headers.get("traceparent")?;
    let mut context = http::HeaderMap::with_capacity(2);
    context.insert("traceparent", parent.clone());
    if let Some(state) = headers.get("tracestate") {
        context.insert("tracestate", state.clone());
    }
    Some(tonic::metadata::MetadataMap::from_headers(context))
}

/// Makes `span` a child of the caller's trace, if the metadata carries one.
pub fn continue_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let parent = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    let _ = span.set_parent(parent);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn trace_context_keeps_the_w3c_headers_only_and_needs_a_traceparent() {
        let mut h = http::HeaderMap::new();
        h.insert("authorization", "Bearer secret".parse().unwrap());
        h.insert("tracestate", "k=v".parse().unwrap());
        assert!(trace_context(&h).is_none(), "tracestate alone is no trace");
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        h.insert("traceparent", parent.parse().unwrap());
        let m = trace_context(&h).unwrap().into_headers();
        assert_eq!(m.len(), 2);
        assert_eq!(m["traceparent"], parent);
        assert_eq!(m["tracestate"], "k=v");
        assert!(m.get("authorization").is_none());
    }

    #[test]
    fn without_an_exporter_spans_are_never_created_and_events_are_logged() {
        for format in [LogFormat::Pretty, LogFormat::Json] {
            let subscriber = tracing_subscriber::registry().with(layers(format, None));
            tracing::subscriber::with_default(subscriber, || {
                assert!(tracing::info_span!("request").is_disabled());
                assert!(tracing::event_enabled!(tracing::Level::WARN));
            });
        }
    }

    /// `init` sets the `log` crate's level from the subscriber's hint: an
    /// unknown hint would pass every `log::trace!` of every dependency.
    #[test]
    fn the_subscriber_knows_its_most_verbose_level() {
        // RUST_LOG is not set under `cargo test` unless a developer sets it.
        let want = Filter::<tracing_subscriber::Registry>::max_level_hint(&env_filter());
        assert!(want.is_some());
        for format in [LogFormat::Pretty, LogFormat::Json] {
            let subscriber = tracing_subscriber::registry().with(layers(format, None));
            assert_eq!(tracing::Subscriber::max_level_hint(&subscriber), want);
        }
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(layers(LogFormat::Pretty, Some(&provider)));
        assert_eq!(tracing::Subscriber::max_level_hint(&subscriber), want);
    }

    #[test]
    fn with_an_exporter_spans_are_created() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(layers(LogFormat::Pretty, Some(&provider)));
        tracing::subscriber::with_default(subscriber, || {
            assert!(!tracing::info_span!("request").is_disabled());
        });
    }
}
