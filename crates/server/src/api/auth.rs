//! Caller authentication: bearer tokens in gRPC metadata mapped to tenants.
//! Tokens are held only as SHA-256 digests and every stored digest is compared
//! in constant time; a failure is UNAUTHENTICATED with no hint of why. In open
//! mode (local use) every caller passes and its `tenant` field is trusted.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use crate::config::{AuthConfig, AuthMode, ConfigError};
use crate::error::RequestError;

/// The authenticated tenant, put in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// SHA-256 digests of tokens with their tenants.
type TokenTable = Vec<([u8; 32], String)>;

/// Checks callers. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    /// `None` in open mode.
    tokens: Option<Arc<TokenTable>>,
}

impl Authenticator {
    /// Every caller passes.
    pub fn open() -> Self {
        Authenticator { tokens: None }
    }

    /// Builds from config, reading the token file and environment variable.
    pub fn from_config(cfg: &AuthConfig) -> Result<Self, ConfigError> {
        if cfg.mode == AuthMode::Open {
            return Ok(Self::open());
        }
        let mut text = String::new();
        if let Some(path) = &cfg.tokens_file {
            text.push_str(&std::fs::read_to_string(path).map_err(|e| ConfigError {
                path: "auth.tokens_file".into(),
                message: format!("cannot read {}: {e}", path.display()),
            })?);
            text.push('\n');
        }
        if let Some(env) = &cfg.tokens_env {
            text.push_str(&std::env::var(env).map_err(|_| ConfigError {
                path: "auth.tokens_env".into(),
                message: format!("environment variable {env} is not set"),
            })?);
        }
        let tokens = parse_tokens(&text).map_err(|message| ConfigError {
            path: "auth".into(),
            message,
        })?;
        if tokens.is_empty() {
            return Err(ConfigError {
                path: "auth.mode".into(),
                message:
                    "`tokens` mode needs at least one tenant:token in tokens_file or tokens_env"
                        .into(),
            });
        }
        Ok(Authenticator {
            tokens: Some(Arc::new(tokens)),
        })
    }

    /// A single token for one principal (the admin token).
    pub fn single(principal: &str, token: &str) -> Self {
        Authenticator {
            tokens: Some(Arc::new(vec![(
                Sha256::digest(token.as_bytes()).into(),
                principal.to_string(),
            )])),
        }
    }

    pub fn is_open(&self) -> bool {
        self.tokens.is_none()
    }

    /// The tenant a bearer token belongs to.
    pub fn tenant_for(&self, token: &str) -> Option<String> {
        let tokens = self.tokens.as_ref()?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (stored, tenant) in tokens.iter() {
            if ct_eq(stored, &digest) {
                found = Some(tenant.clone());
            }
        }
        found
    }

    /// The tenant of an `Authorization: Bearer <token>` value, for every
    /// door: `None` in open mode, UNAUTHENTICATED for a missing or unknown token.
    pub fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<Option<String>, RequestError> {
        if self.is_open() {
            return Ok(None);
        }
        let token = authorization
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        match token.and_then(|t| self.tenant_for(t)) {
            Some(tenant) => Ok(Some(tenant)),
            None => Err(RequestError::Unauthenticated(
                "missing or unknown bearer token (`authorization: Bearer <token>`)".into(),
            )),
        }
    }

    /// The gRPC interceptor body: adds [`Tenant`] or refuses.
    pub fn check(&self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let value = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.authenticate(value) {
            Ok(Some(tenant)) => {
                request.extensions_mut().insert(Tenant(tenant));
                Ok(request)
            }
            Ok(None) => Ok(request),
            Err(e) => Err(super::errors::to_status(&e)),
        }
    }
}

/// Parses `tenant:token` entries separated by newlines or commas.
fn parse_tokens(text: &str) -> Result<TokenTable, String> {
    let mut out = Vec::new();
    for (n, entry) in text.split(['\n', ',']).enumerate() {
        let entry = entry.trim();
        if entry.is_empty() || entry.starts_with('#') {
            continue;
        }
        let (tenant, token) = entry
            .split_once(':')
            .ok_or_else(|| format!("token entry {} is not tenant:token", n + 1))?;
        let (tenant, token) = (tenant.trim(), token.trim());
        if tenant.is_empty() || token.len() < 16 {
            return Err(format!(
                "token entry {} needs a tenant and a token of at least 16 characters",
                n + 1
            ));
        }
        out.push((Sha256::digest(token.as_bytes()).into(), tenant.to_string()));
    }
    Ok(out)
}

/// Constant-time equality of two digests.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn auth() -> Authenticator {
        Authenticator {
            tokens: Some(Arc::new(
                parse_tokens(
                    "# comment\nteam-a:aaaaaaaaaaaaaaaaaaaa\n team-b : bbbbbbbbbbbbbbbbbbbb ",
                )
                .unwrap(),
            )),
        }
    }

    fn with_auth(v: &str) -> Request<()> {
        let mut r = Request::new(());
        r.metadata_mut().insert("authorization", v.parse().unwrap());
        r
    }

    #[test]
    fn tokens_map_to_tenants() {
        let a = auth();
        let r = a.check(with_auth("Bearer bbbbbbbbbbbbbbbbbbbb")).unwrap();
        assert_eq!(
            r.extensions().get::<Tenant>(),
            Some(&Tenant("team-b".into()))
        );
        assert_eq!(
            a.check(with_auth("Bearer nope-nope-nope-nope"))
                .unwrap_err()
                .code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            a.check(Request::new(())).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(Authenticator::open().check(Request::new(())).is_ok());
    }

    #[test]
    fn short_or_malformed_tokens_are_config_errors() {
        assert!(parse_tokens("team:short").is_err());
        assert!(parse_tokens("no-colon-here-at-all").is_err());
        assert_eq!(
            parse_tokens("a:0123456789abcdef,b:0123456789abcdeg")
                .unwrap()
                .len(),
            2
        );
    }
}
