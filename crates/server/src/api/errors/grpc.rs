//! An error as a gRPC status: the row's code, `google.rpc.ErrorInfo`
//! (reason, domain, metadata) and `RetryInfo` when the row sends one and a
//! time is known.

use std::collections::HashMap;

use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};

use super::admin::AdminError;
use super::{CallerError, DOMAIN};
use crate::error::RequestError;

impl CallerError {
    /// The status the caller receives.
    pub fn to_status(&self) -> Status {
        let entry = self.entry();
        let meta: HashMap<String, String> = self
            .meta
            .iter()
            .map(|(key, value)| (key.to_string(), value.clone()))
            .collect();
        let mut details = ErrorDetails::with_error_info(entry.reason, DOMAIN, meta);
        if let Some(delay) = self.retry_after {
            details.set_retry_info(Some(delay));
        }
        Status::with_error_details(entry.grpc, self.message.clone(), details)
    }
}

/// Maps a request error to the status the caller receives.
pub fn to_status(err: &RequestError) -> Status {
    CallerError::from(err).to_status()
}

/// Maps an Admin API refusal to its status.
pub fn admin_status(err: &AdminError) -> Status {
    CallerError::from(err).to_status()
}
