//! Where `switchyard plan` gets its figures: a running Switchyard's admin
//! listener (two `/metrics` scrapes a window apart, plus `/v1/status`), or a
//! Prometheus server (instant queries over the window, divided by the
//! replicas that report). Fetching only: each path ends in [`Observed`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::model::Observed;
use super::scrape::{self, Scrape};
use super::PlanError;

const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

fn client() -> Result<reqwest::Client, PlanError> {
    reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .build()
        .map_err(|e| PlanError::Fetch(format!("cannot build an HTTP client: {e}")))
}

/// Where the figures come from: the base URL without its userinfo (the
/// only form printed, in the report and in errors) and the credentials it
/// carried, sent as basic auth and never printed.
pub struct Remote {
    pub base: String,
    auth: Option<(String, Option<String>)>,
}

impl Remote {
    /// `text` as given to `--admin` (HOST:PORT or a URL) or `--prometheus`.
    pub fn parse(text: &str) -> Result<Remote, PlanError> {
        let with_scheme = if text.contains("://") {
            text.to_string()
        } else {
            format!("http://{text}")
        };
        // The text may hold a password: the error never repeats it.
        let mut url = reqwest::Url::parse(&with_scheme)
            .map_err(|e| PlanError::Usage(format!("the address is not a URL: {e}")))?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let user = decode(url.username());
        let password = url.password().map(decode);
        let auth = (!user.is_empty() || password.is_some()).then_some((user, password));
        let _ = url.set_username("");
        let _ = url.set_password(None);
        Ok(Remote {
            base: url.as_str().trim_end_matches('/').to_string(),
            auth,
        })
    }

    fn get(&self, http: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let request = http.get(url);
        match &self.auth {
            Some((user, password)) => request.basic_auth(user, password.as_ref()),
            None => request,
        }
    }
}

/// Sends a GET of `url` and reads the whole body.
async fn send(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<(reqwest::StatusCode, String), PlanError> {
    let fail = |e: reqwest::Error| PlanError::Fetch(format!("GET {url}: {}", e.without_url()));
    let r = request.send().await.map_err(fail)?;
    let status = r.status();
    Ok((status, r.text().await.map_err(fail)?))
}

async fn get_text(http: &reqwest::Client, remote: &Remote, url: &str) -> Result<String, PlanError> {
    let (status, body) = send(remote.get(http, url), url).await?;
    if !status.is_success() {
        return Err(PlanError::Fetch(format!("GET {url}: {status}: {body}")));
    }
    Ok(body)
}

/// The parts of `/v1/status` the plan reads.
#[derive(Debug, Deserialize)]
struct Status {
    targets: Vec<StatusTarget>,
    routes: Vec<StatusRoute>,
}

#[derive(Debug, Deserialize)]
struct StatusTarget {
    provider: String,
    model: String,
    breaker_state: String,
}

#[derive(Debug, Deserialize)]
struct StatusRoute {
    name: String,
    targets: Vec<String>,
}

/// What the admin listener says, and how its routes differ from the config's.
pub struct AdminReading {
    pub observed: Observed,
    /// One line per route whose running targets differ from the config file's.
    pub mismatches: Vec<String>,
}

/// Two scrapes `window` apart and the status, from `addr` (HOST:PORT or a URL).
pub async fn admin(
    addr: &str,
    window: Duration,
    routes: &BTreeMap<String, Vec<String>>,
) -> Result<AdminReading, PlanError> {
    let http = client()?;
    let remote = Remote::parse(addr)?;
    let base = &remote.base;
    let metrics = format!("{base}/metrics");
    let before = Scrape::parse(&get_text(&http, &remote, &metrics).await?);
    let started = tokio::time::Instant::now();
    tokio::time::sleep(window).await;
    let after = Scrape::parse(&get_text(&http, &remote, &metrics).await?);
    let secs = started.elapsed().as_secs_f64();
    let mut observed = scrape::observe(&before, &after, secs);
    let status_url = format!("{base}/v1/status");
    let status: Status = serde_json::from_str(&get_text(&http, &remote, &status_url).await?)
        .map_err(|e| PlanError::Fetch(format!("GET {status_url}: {e}")))?;
    // The status names forced states, which the gauge folds into open/closed.
    for t in status.targets {
        observed
            .breakers
            .insert((t.provider, t.model), t.breaker_state);
    }
    let mut mismatches = Vec::new();
    for r in &status.routes {
        match routes.get(&r.name) {
            Some(want) if *want == r.targets => {}
            Some(want) => mismatches.push(format!(
                "route {}: running targets [{}], the config file says [{}]",
                r.name,
                r.targets.join(", "),
                want.join(", ")
            )),
            None => mismatches.push(format!("route {}: running, not in the config file", r.name)),
        }
    }
    for name in routes.keys() {
        if !status.routes.iter().any(|r| r.name == *name) {
            mismatches.push(format!(
                "route {name}: in the config file, not running there"
            ));
        }
    }
    Ok(AdminReading {
        observed,
        mismatches,
    })
}

/// Which [`Observed`] field a query fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    Served,
    Shed,
    Duration,
    Attempts,
    RateLimited,
    Breakers,
    UpstreamRpm,
}

/// The instant queries `--prometheus` runs; `{w}` is the window. Sums over
/// replicas; [`REPLICAS`] divides them back to one replica.
pub const QUERIES: &[(Figure, &str)] = &[
    (
        Figure::Served,
        r#"sum by (route, provider) (rate(switchyard_requests_served_total{tier=~"primary|fallback"}[{w}]))"#,
    ),
    (
        Figure::Shed,
        "sum by (route, reason) (rate(switchyard_requests_shed_total[{w}]))",
    ),
    (
        Figure::Duration,
        "sum by (provider, gen_ai_request_model) (rate(gen_ai_client_operation_duration_seconds_sum[{w}])) \
         / sum by (provider, gen_ai_request_model) (rate(gen_ai_client_operation_duration_seconds_count[{w}]))",
    ),
    (
        Figure::Attempts,
        "sum by (provider, model) (rate(switchyard_upstream_attempts_total[{w}]))",
    ),
    (
        Figure::RateLimited,
        r#"sum by (provider, model) (rate(switchyard_upstream_attempts_total{outcome="rate_limited"}[{w}]))"#,
    ),
    (Figure::Breakers, "max by (provider, model) (switchyard_breaker_state)"),
    // Fleet-wide already (every replica sees the same windows): the largest
    // any replica reports, never a sum over replicas.
    (
        Figure::UpstreamRpm,
        r#"max by (provider) (sum by (provider, instance) (switchyard_key_window_limit{kind="requests"}))"#,
    ),
];

/// How many replicas report (each has its own ceilings).
pub const REPLICAS: &str = "count(count by (instance) (switchyard_breaker_state))";

#[derive(Debug, Deserialize)]
struct QueryAnswer {
    status: String,
    #[serde(default)]
    data: Option<QueryData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct QueryData {
    result: Vec<VectorSample>,
}

#[derive(Debug, Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

async fn query(
    http: &reqwest::Client,
    remote: &Remote,
    promql: &str,
) -> Result<Vec<VectorSample>, PlanError> {
    let url = format!("{}/api/v1/query", remote.base);
    let (status, text) = send(remote.get(http, &url).query(&[("query", promql)]), &url).await?;
    let answer: QueryAnswer = serde_json::from_str(&text)
        .map_err(|e| PlanError::Fetch(format!("{url} ({status}): {e}: {text}")))?;
    match (answer.status.as_str(), answer.data) {
        ("success", Some(d)) => Ok(d.result),
        _ => Err(PlanError::Fetch(format!(
            "{url}: query `{promql}` failed: {}",
            answer.error.unwrap_or(text)
        ))),
    }
}

/// Prometheus' duration syntax for a window (whole seconds, at least 1).
pub fn promql_duration(window: Duration) -> String {
    format!("{}s", window.as_secs().max(1))
}

/// Instant queries over `window` at a Prometheus server, per replica.
pub async fn prometheus(url: &str, window: Duration) -> Result<Observed, PlanError> {
    let http = client()?;
    let remote = Remote::parse(url)?;
    let base = &remote.base;
    let w = promql_duration(window);
    let replicas = query(&http, &remote, REPLICAS)
        .await?
        .first()
        .and_then(|s| s.value.1.parse::<f64>().ok())
        .filter(|n| *n >= 1.0)
        .ok_or_else(|| {
            PlanError::Fetch(format!(
                "{base}: no series of switchyard_breaker_state: is Prometheus scraping Switchyard?"
            ))
        })?;
    let mut o = Observed {
        window_secs: window.as_secs_f64(),
        replicas,
        ..Default::default()
    };
    for (figure, q) in QUERIES {
        let promql = q.replace("{w}", &w);
        for s in query(&http, &remote, &promql).await? {
            let Ok(v) = s.value.1.parse::<f64>() else {
                continue;
            };
            if !v.is_finite() {
                continue;
            }
            let l = |k: &str| s.metric.get(k).cloned().unwrap_or_default();
            match figure {
                Figure::Served => {
                    o.served.insert((l("route"), l("provider")), v / replicas);
                }
                Figure::Shed => {
                    o.shed.insert((l("route"), l("reason")), v / replicas);
                }
                Figure::Duration => {
                    o.duration
                        .insert((l("provider"), l("gen_ai_request_model")), v);
                }
                Figure::Attempts => {
                    o.attempts.insert((l("provider"), l("model")), v / replicas);
                }
                Figure::RateLimited => {
                    o.rate_limited
                        .insert((l("provider"), l("model")), v / replicas);
                }
                Figure::Breakers => {
                    o.breakers.insert(
                        (l("provider"), l("model")),
                        scrape::breaker_phase(v).to_string(),
                    );
                }
                Figure::UpstreamRpm => {
                    o.upstream_rpm.insert(l("provider"), v);
                }
            }
        }
    }
    Ok(o)
}
