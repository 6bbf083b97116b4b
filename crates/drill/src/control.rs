//! What the drill drives besides the router: the mock upstreams (in process
//! through their handles, remote through `/_mock/*` over HTTP) and the
//! router's status (in process through `admin::collect`, remote through
//! `Admin.ListProviders`). Same answers either way; no policy here.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::transport::Channel;

use switchyard::actors::registry::Registry;
use switchyard::api::admin::collect;
use switchyard::proto;
use switchyard_mock::{FaultSpec, MockHandle, RequestRecord, Stats};

use super::scenario::MockSpec;
use super::DrillError;

/// One mock upstream under the drill's control.
pub enum Mock {
    Local(MockHandle),
    Remote { http: reqwest::Client, url: String },
}

/// The control URL of a remote mock: `http://HOST:PORT` (a trailing `/v1` is dropped).
pub fn control_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    let url = url.strip_suffix("/v1").unwrap_or(url);
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

fn remote_err(url: &str, what: &str, e: impl std::fmt::Display) -> DrillError {
    DrillError::Remote(format!("mock {url}: {what}: {e}"))
}

impl Mock {
    pub fn remote(url: &str) -> Result<Mock, DrillError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| DrillError::Remote(format!("HTTP client: {e}")))?;
        Ok(Mock::Remote {
            http,
            url: control_url(url),
        })
    }

    /// Applies the scenario's token count, delay and capacity (remote only;
    /// in-process mocks are started with them).
    pub async fn configure(&self, spec: &MockSpec) -> Result<(), DrillError> {
        let Mock::Remote { http, url } = self else {
            return Ok(());
        };
        let body = serde_json::json!({
            "tokens": spec.tokens,
            "token_delay_ms": spec.token_delay_ms,
            "max_concurrency": spec.max_concurrency,
        });
        let r = http
            .put(format!("{url}/_mock/config"))
            .json(&body)
            .send()
            .await
            .map_err(|e| remote_err(url, "PUT /_mock/config", e))?;
        check(url, "PUT /_mock/config", r).await
    }

    pub async fn set_fault(&self, spec: &FaultSpec) -> Result<(), DrillError> {
        match self {
            Mock::Local(h) => {
                h.apply_fault(spec.clone()).await;
                Ok(())
            }
            Mock::Remote { http, url } => {
                let r = http
                    .put(format!("{url}/_mock/faults"))
                    .json(spec)
                    .send()
                    .await
                    .map_err(|e| remote_err(url, "PUT /_mock/faults", e))?;
                check(url, "PUT /_mock/faults", r).await
            }
        }
    }

    pub async fn clear(&self) -> Result<(), DrillError> {
        match self {
            Mock::Local(h) => {
                h.clear_requests();
                Ok(())
            }
            Mock::Remote { http, url } => {
                let r = http
                    .delete(format!("{url}/_mock/requests"))
                    .send()
                    .await
                    .map_err(|e| remote_err(url, "DELETE /_mock/requests", e))?;
                check(url, "DELETE /_mock/requests", r).await
            }
        }
    }

    pub async fn requests(&self) -> Result<Vec<RequestRecord>, DrillError> {
        match self {
            Mock::Local(h) => Ok(h.requests()),
            Mock::Remote { http, url } => get_json(http, url, "/_mock/requests").await,
        }
    }

    pub async fn stats(&self) -> Result<Stats, DrillError> {
        match self {
            Mock::Local(h) => Ok(h.stats()),
            Mock::Remote { http, url } => get_json(http, url, "/_mock/stats").await,
        }
    }

    /// Stops an in-process mock.
    pub async fn shutdown(self) {
        if let Mock::Local(h) = self {
            h.shutdown().await;
        }
    }
}

async fn check(url: &str, what: &str, r: reqwest::Response) -> Result<(), DrillError> {
    if r.status().is_success() {
        return Ok(());
    }
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    Err(remote_err(url, what, format!("{status}: {body}")))
}

async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    path: &str,
) -> Result<T, DrillError> {
    let what = format!("GET {path}");
    let r = http
        .get(format!("{url}{path}"))
        .send()
        .await
        .map_err(|e| remote_err(url, &what, e))?;
    if !r.status().is_success() {
        return Err(remote_err(url, &what, r.status()));
    }
    r.json().await.map_err(|e| remote_err(url, &what, e))
}

/// The router's view at one moment: breaker state per provider (of model
/// `m` in process, of the first model listed remotely) and the route's budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub breakers: BTreeMap<String, String>,
    pub budget: Option<f64>,
}

/// Where breaker and budget states come from.
pub enum StatusSource {
    Local(std::sync::Arc<Registry>),
    Remote {
        client: proto::admin_client::AdminClient<Channel>,
        token: Option<String>,
    },
}

impl StatusSource {
    /// The current snapshot; `None` when the remote Admin API cannot be read.
    pub async fn snapshot(&mut self, route: &str) -> Option<Snapshot> {
        match self {
            StatusSource::Local(registry) => {
                let view =
                    collect(registry, &switchyard::state::limits::KeyLimits::embedded()).await;
                let mut s = Snapshot::default();
                for t in view.targets {
                    s.breakers
                        .entry(t.provider)
                        .or_insert_with(|| t.breaker_state.to_string());
                }
                s.budget = view
                    .routes
                    .iter()
                    .find(|r| r.name == route)
                    .map(|r| r.retry_budget_remaining);
                Some(s)
            }
            StatusSource::Remote { client, token } => {
                let list = list_providers(client, token.as_deref()).await.ok()?;
                let mut s = Snapshot::default();
                for t in list.targets {
                    s.breakers.entry(t.provider).or_insert(t.breaker_state);
                }
                s.budget = list
                    .routes
                    .iter()
                    .find(|r| r.name == route)
                    .map(|r| r.retry_budget_remaining);
                Some(s)
            }
        }
    }
}

/// `Admin.ListProviders`, with the admin token when given.
pub async fn list_providers(
    client: &mut proto::admin_client::AdminClient<Channel>,
    token: Option<&str>,
) -> Result<proto::ListProvidersResponse, tonic::Status> {
    let mut req = tonic::Request::new(proto::ListProvidersRequest {});
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("the admin token is not header-safe"))?;
        req.metadata_mut().insert("authorization", value);
    }
    client.list_providers(req).await.map(|r| r.into_inner())
}
