//! The gRPC size limits in the error table's terms. Metadata: h2 accepts
//! header blocks up to [`H2_MAX_HEADER_LIST`] and the gRPC server answers a call
//! whose metadata is over `limits.max_metadata_bytes` with RESOURCE_EXHAUSTED
//! (METADATA_TOO_LARGE) before any service runs; messages: tonic refuses a
//! request message over `limits.max_request_bytes` with OUT_OF_RANGE, and
//! [`rewrite`] turns that one answer to RESOURCE_EXHAUSTED
//! (REQUEST_TOO_LARGE, with ErrorInfo), as gRPC's status-code guide says for
//! "message larger than configured max". Either way the connection and its
//! other streams are untouched. The gRPC server ([`super::grpc_server`])
//! applies both to every call.

use http::HeaderMap;

use super::errors::to_status;
use crate::error::RequestError;

/// The header block h2 itself accepts. Above it h2 protects the connection
/// (it is reset); below it, a too-large call gets a status of its own.
pub const H2_MAX_HEADER_LIST: u32 = 1024 * 1024;

/// A header map's size as HTTP/2 counts it (RFC 9113 §6.5.2).
pub fn metadata_size(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum()
}

/// tonic's text for a message over the decoding limit (percent-encoded in
/// `grpc-message`, as tonic sends it).
const TONIC_TOO_LARGE: &[u8] = b"decoded%20message%20length%20too%20large";

/// Turns tonic's OUT_OF_RANGE refusal of a message over `limit` into
/// RESOURCE_EXHAUSTED (REQUEST_TOO_LARGE); any other answer is left as it is.
pub fn rewrite(headers: &mut HeaderMap, limit: usize) {
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
