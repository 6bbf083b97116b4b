//! The gRPC size limits in the error table's terms. Metadata: h2 accepts
//! header blocks up to [`H2_MAX_HEADER_LIST`] and this layer answers a call
//! whose metadata is over `limits.max_metadata_bytes` with RESOURCE_EXHAUSTED
//! (METADATA_TOO_LARGE) before any service runs; messages: tonic refuses a
//! request message over `limits.max_request_bytes` with OUT_OF_RANGE, and
//! this layer rewrites that one answer to RESOURCE_EXHAUSTED
//! (REQUEST_TOO_LARGE, with ErrorInfo), as gRPC's status-code guide says for
//! "message larger than configured max". Either way the connection and its
//! other streams are untouched. The layer is also where the Router
//! service's calls leave tonic's path router for the service itself
//! ([`TooLargeLayer::direct`]), past the same limits.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use tonic::body::Body;

use super::errors::to_status;
use crate::error::RequestError;

/// The header block h2 itself accepts. Above it h2 protects the connection
/// (it is reset); below it, a too-large call gets a status of its own.
pub const H2_MAX_HEADER_LIST: u32 = 1024 * 1024;

/// Wraps the gRPC services. `direct` is the Router service: its calls
/// (every request a caller sends) go to it straight, not through tonic's
/// path router, which for each call matches the path, clones and boxes the
/// route's service and inserts URL parameters (measured: seven allocations
/// a call). Every other service (health, reflection, Admin) is routed by
/// path as before.
#[derive(Debug, Clone)]
pub struct TooLargeLayer<D> {
    pub limit: usize,
    /// `limits.max_metadata_bytes`.
    pub max_metadata: usize,
    pub direct: D,
}

impl<S, D: Clone> tower_layer::Layer<S> for TooLargeLayer<D> {
    type Service = TooLarge<S, D>;

    fn layer(&self, inner: S) -> TooLarge<S, D> {
        TooLarge {
            inner,
            direct: self.direct.clone(),
            limit: self.limit,
            max_metadata: self.max_metadata,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TooLarge<S, D> {
    inner: S,
    direct: D,
    limit: usize,
    max_metadata: usize,
}

/// The path prefix of the Router service's methods.
const DIRECT_PREFIX: &str = "/switchyard.v1.Router/";

/// A header map's size as HTTP/2 counts it (RFC 9113 §6.5.2).
pub fn metadata_size(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum()
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, D, DirectBody> tower_service::Service<http::Request<Body>> for TooLarge<S, D>
where
    S: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
    D: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<DirectBody>,
        Error = Infallible,
    >,
    D::Future: Send + 'static,
    DirectBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    DirectBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The direct service is tonic's generated server behind an
        // interceptor: always ready, as tonic's own router assumes.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let size = metadata_size(request.headers());
        if size > self.max_metadata {
            let status = to_status(&RequestError::MetadataTooLarge {
                size,
                limit: self.max_metadata,
            });
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let limit = self.limit;
        if request.uri().path().starts_with(DIRECT_PREFIX) {
            let answer = self.direct.call(request);
            return Box::pin(async move {
                let mut response = answer.await?.map(Body::new);
                rewrite(response.headers_mut(), limit);
                Ok(response)
            });
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            rewrite(response.headers_mut(), limit);
            Ok(response)
        })
    }
}

/// tonic's text for a message over the decoding limit (percent-encoded in
/// `grpc-message`, as tonic sends it).
const TONIC_TOO_LARGE: &[u8] = b"decoded%20message%20length%20too%20large";

fn rewrite(headers: &mut HeaderMap, limit: usize) {
    let out_of_range = headers.get("grpc-status").map(|v| v.as_bytes()) == Some(b"11");
    let too_large = headers
        .get("grpc-message")
        .is_some_and(|m| contains(m.as_bytes(), TONIC_TOO_LARGE));
    if out_of_range && too_large {
        let status = to_status(&RequestError::RequestTooLarge { limit });
        let _ = status.add_header(headers);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn only_tonics_size_refusal_is_rewritten() {
        let mut h = HeaderMap::new();
        tonic::Status::out_of_range(
            "Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes",
        )
        .add_header(&mut h)
        .unwrap();
        rewrite(&mut h, 4);
        let s = tonic::Status::from_header_map(&h).unwrap();
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let info = s.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "REQUEST_TOO_LARGE");
        assert_eq!(info.metadata["limit_bytes"], "4");

        let mut h = HeaderMap::new();
        tonic::Status::out_of_range("something else")
            .add_header(&mut h)
            .unwrap();
        rewrite(&mut h, 4);
        assert_eq!(
            tonic::Status::from_header_map(&h).unwrap().code(),
            tonic::Code::OutOfRange
        );
    }
}
