//! What the Admin API refuses, and which row of the table each refusal is.
//! Each answers with `ErrorInfo` in the same domain as a request error, so
//! an operator's tooling decodes one table.

use super::{CallerError, Kind};

/// What the Admin API refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdminError {
    #[error("the admin API is disabled: set admin.token_env to enable it")]
    Disabled,
    /// A field of the request is missing or wrong; `field` names it.
    #[error("{field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    #[error("provider: unknown provider `{0}`")]
    UnknownProvider(String),
    /// The provider does not serve this model (its own words).
    #[error("model: {0}")]
    UnknownModel(String),
    #[error("route: unknown route `{0}`")]
    UnknownRoute(String),
    /// The provider's actor did not answer in time (restarting or stuck).
    #[error("provider actor did not answer")]
    ProviderUnavailable(String),
    /// The validation record file could not be written.
    #[error("the record file: {0}")]
    RecordFile(String),
}

impl From<&AdminError> for CallerError {
    fn from(err: &AdminError) -> Self {
        let (kind, meta) = match err {
            AdminError::Disabled => (Kind::AdminDisabled, None),
            AdminError::InvalidArgument { field, .. } => (
                Kind::AdminInvalidArgument,
                Some(("field", field.to_string())),
            ),
            AdminError::UnknownProvider(p) => {
                (Kind::UnknownProvider, Some(("provider", p.clone())))
            }
            AdminError::UnknownModel(_) => (Kind::UnknownModel, None),
            AdminError::UnknownRoute(r) => (Kind::UnknownRoute, Some(("route", r.clone()))),
            AdminError::ProviderUnavailable(p) => {
                (Kind::ProviderUnavailable, Some(("provider", p.clone())))
            }
            AdminError::RecordFile(_) => (Kind::ValidationStoreUnavailable, None),
        };
        let caught = CallerError::new(kind, err.to_string());
        match meta {
            Some((key, value)) => caught.meta(key, value),
            None => caught,
        }
    }
}
