//! The `golden` command's run: loads the config, the route and the set;
//! drives a Switchyard (started in process from the config, or a running
//! one at `--target`) with every case pinned to every target of the route;
//! judges the answers; prints a table per target; and stores the route's
//! validation record through `Admin.RecordValidation` (and `--record`).
//! Exit: 0 every target validated, 1 some target not, 2 could not run.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tonic::metadata::MetadataValue;

use super::judge::{self, Answer, CaseResult};
use super::set::{self, Case};
use switchyard::config::Config;
use switchyard::proto;
use switchyard::state::validation::record::{Records, RouteValidation, TargetValidation};

/// `switchyard golden --route NAME --set FILE [--target ADDR]`.
#[derive(clap::Args, Debug, Clone)]
pub struct GoldenArgs {
    /// The route whose targets (and downshift targets) are checked.
    #[arg(long)]
    pub route: String,
    /// The golden set: TOML (`[[case]]`) or JSONL (`*.jsonl`).
    #[arg(long)]
    pub set: PathBuf,
    /// The Switchyard config (the route's targets, the embedder; in process,
    /// the whole server).
    #[arg(long, short, default_value = "switchyard.toml")]
    pub config: PathBuf,
    /// Drive a running Switchyard at HOST:PORT (its gRPC listener) instead
    /// of starting one in process from the config.
    #[arg(long, value_name = "HOST:PORT")]
    pub target: Option<String>,
    /// Environment variable holding the admin token (RecordValidation);
    /// default: the config's `admin.token_env`.
    #[arg(long, value_name = "VAR")]
    pub admin_token_env: Option<String>,
    /// Environment variable holding a caller token, if callers authenticate.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Also store the record in this file (next to other routes' records).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// `provider/model` embedding the answers for their similarity
    /// (default: the route's `semantic_cache.embedder`; none: lexical).
    #[arg(long)]
    pub embedder: Option<String>,
    /// Mean similarity to the first target's answers a target needs
    /// (default 0.8 with an embedder; not required with lexical similarity).
    #[arg(long)]
    pub min_similarity: Option<f64>,
    /// Seconds one case may take.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    /// Print the record as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Why the golden run could not produce a verdict (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    #[error("{0}")]
    Usage(String),
    #[error("config: {0}")]
    Config(String),
    #[error("golden set {0}")]
    Set(String),
    #[error("cannot start the in-process router: {0}")]
    Start(String),
    #[error("switchyard: {0}")]
    Remote(String),
}

impl GoldenError {
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs the command, printing to stdout.
pub async fn run(args: GoldenArgs) -> Result<bool, GoldenError> {
    let mut stdout = std::io::stdout();
    run_to(args, &mut stdout).await
}

/// Embeds answers for their similarity.
struct Embedder {
    endpoint: switchyard::upstream::endpoint::Endpoint,
    model: String,
}

impl Embedder {
    fn from_config(config: &Config, target: &str) -> Result<Embedder, GoldenError> {
        let at = config
            .resolve_target(target)
            .map_err(|e| GoldenError::Usage(format!("embedder: {e}")))?;
        let p = &config.providers[at.provider];
        let endpoint = switchyard::upstream::endpoint::Endpoint::new(p)
            .map_err(|e| GoldenError::Config(format!("embedder `{target}`: {e}")))?;
        Ok(Embedder {
            endpoint,
            model: p.models[at.model].name.clone(),
        })
    }

    async fn embed(&self, text: &str) -> Option<Vec<f32>> {
        let v = switchyard::semantic::embed::fetch(&self.endpoint, &self.model, text)
            .await
            .ok()?;
        switchyard::semantic::index::normalized(v)
    }
}

/// An answer as text for similarity: its words and its calls.
fn comparable(a: &Answer) -> String {
    let mut s = a.text.clone();
    for (name, args) in &a.tool_calls {
        s.push_str(&format!(" {name} {args}"));
    }
    s
}

/// Like [`run`], writing to `out`.
pub async fn run_to(args: GoldenArgs, out: &mut (dyn Write + Send)) -> Result<bool, GoldenError> {
    let config = Config::load(&args.config)
        .map_err(|e| GoldenError::Config(format!("{}: {e}", args.config.display())))?;
    let route = config
        .routes
        .iter()
        .find(|r| r.name == args.route)
        .ok_or_else(|| {
            let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
            GoldenError::Usage(format!(
                "--route: no route `{}` in {} (routes: {})",
                args.route,
                args.config.display(),
                names.join(", ")
            ))
        })?;
    let targets: Vec<String> = route
        .targets
        .iter()
        .chain(route.downshift.iter())
        .map(|t| t.target.clone())
        .collect();
    let text = std::fs::read_to_string(&args.set)
        .map_err(|e| GoldenError::Set(format!("{}: {e}", args.set.display())))?;
    let jsonl = args.set.extension().is_some_and(|e| e == "jsonl");
    let cases = set::parse(&text, jsonl)
        .map_err(|e| GoldenError::Set(format!("{}: {e}", args.set.display())))?;
    let set_sha256: String = Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let embedder = match args
        .embedder
        .clone()
        .or_else(|| route.semantic_cache.as_ref().map(|s| s.embedder.clone()))
    {
        Some(t) => Some(Embedder::from_config(&config, &t)?),
        None => None,
    };
    let caller = token(args.token_env.as_deref())?;
    let admin_env = args
        .admin_token_env
        .clone()
        .or(config.admin.token_env.clone());
    let admin = token(admin_env.as_deref())?;

    let (addr, running) = match &args.target {
        Some(addr) => (addr.clone(), None),
        None => {
            let mut local = config.clone();
            let any = SocketAddr::from(([127, 0, 0, 1], 0));
            local.server.grpc_listen = any;
            local.server.admin_listen = any;
            local.server.http_listen = None;
            // Its own state: never the fleet's queue, jobs or ledger.
            local.queue = None;
            local.state = switchyard::config::StateConfig::default();
            for r in &mut local.routes {
                r.ladder
                    .retain(|rung| *rung != switchyard::config::Rung::Queue);
            }
            let running = switchyard::app::start(local, None)
                .await
                .map_err(|e| GoldenError::Start(e.to_string()))?;
            (running.grpc_addr.to_string(), Some(running))
        }
    };
    let mut stderr = std::io::stderr();
    // With --json, stdout carries the record alone.
    let notes: &mut (dyn Write + Send) = if args.json { &mut stderr } else { out };
    let _ = writeln!(
        notes,
        "golden set {} ({} cases, sha256 {}) on route `{}`: {} targets through {}{}",
        args.set.display(),
        cases.len(),
        &set_sha256[..12],
        args.route,
        targets.len(),
        addr,
        if running.is_some() {
            " (in process)"
        } else {
            ""
        }
    );
    let session = Session {
        channel: connect(&addr).await,
        caller,
        admin,
        timeout: Duration::from_secs(args.timeout_secs.max(1)),
    };
    let outcome = match &session.channel {
        Ok(_) => Ok(answers(&session, &args.route, &cases, &targets).await),
        Err(e) => Err(GoldenError::Remote(e.clone())),
    };
    let verdict = match outcome {
        Ok(answers) => {
            let (kind, sims) = similarities(&answers, embedder.as_ref()).await;
            let min = args.min_similarity.or((kind == "embedding").then_some(0.8));
            let targets: Vec<TargetValidation> = answers
                .iter()
                .zip(&sims)
                .map(|((target, given), sims)| {
                    let results: Vec<CaseResult> = cases
                        .iter()
                        .zip(given)
                        .zip(sims)
                        .map(|((c, a), s)| judge::judge(c, a, *s))
                        .collect();
                    judge::verdict(target, &results, kind, min)
                })
                .collect();
            let record = RouteValidation {
                route: args.route.clone(),
                validated_unix_ms: unix_ms(),
                set: args.set.display().to_string(),
                set_sha256,
                targets,
            };
            print(out, &record, args.json);
            let notes: &mut (dyn Write + Send) = if args.json { &mut stderr } else { out };
            store(&session, &record, args.record.as_ref(), notes)
                .await
                .map(|()| record)
        }
        Err(e) => Err(e),
    };
    if let Some(r) = running {
        r.shutdown().await;
    }
    Ok(verdict?.targets.iter().all(|t| t.validated))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The connection to the Switchyard under test and its credentials.
struct Session {
    channel: Result<tonic::transport::Channel, String>,
    caller: Option<String>,
    admin: Option<String>,
    timeout: Duration,
}

impl Session {
    fn request<T>(&self, body: T, bearer: Option<&String>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(body);
        r.set_timeout(self.timeout);
        if let Some(v) = bearer.and_then(|t| MetadataValue::try_from(format!("Bearer {t}")).ok()) {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }
}

async fn connect(addr: &str) -> Result<tonic::transport::Channel, String> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| format!("--target {addr}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// The request a case sends, pinned to `target`.
fn case_request(route: &str, case: &Case, target: &str) -> proto::CompletionRequest {
    let mut messages = Vec::new();
    if let Some(system) = &case.system {
        messages.push(proto::Message {
            role: "system".into(),
            content: system.clone(),
            ..Default::default()
        });
    }
    messages.push(proto::Message {
        role: "user".into(),
        content: case.prompt.clone(),
        ..Default::default()
    });
    proto::CompletionRequest {
        route: route.to_string(),
        messages,
        max_tokens: case.max_tokens,
        temperature: Some(0.0),
        tools: case
            .tools
            .iter()
            .map(|t| proto::Tool {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters_json: t.parameters.to_string(),
                ..Default::default()
            })
            .collect(),
        response_format: if case.schema.is_some() {
            proto::ResponseFormat::JsonObject as i32
        } else {
            proto::ResponseFormat::Unspecified as i32
        },
        target: target.to_string(),
        ..Default::default()
    }
}

/// Cases in flight at once for one target.
const CONCURRENT_CASES: usize = 4;

/// Every target's answers to every case, in order (the first target first).
async fn answers(
    session: &Session,
    route: &str,
    cases: &[Case],
    targets: &[String],
) -> Vec<(String, Vec<Answer>)> {
    let Ok(channel) = &session.channel else {
        return Vec::new();
    };
    let mut all = Vec::new();
    for target in targets {
        let ask = |case: &Case| {
            let mut client = proto::router_client::RouterClient::new(channel.clone());
            let req = session.request(case_request(route, case, target), session.caller.as_ref());
            async move {
                match client.complete(req).await {
                    Ok(r) => answer_of(r.into_inner(), target),
                    Err(status) => Answer {
                        error: Some(format!("{:?}: {}", status.code(), status.message())),
                        ..Answer::default()
                    },
                }
            }
        };
        // A few cases at once per target, answers kept in case order.
        let given: Vec<Answer> = futures_util::stream::iter(cases.iter().map(ask))
            .buffered(CONCURRENT_CASES)
            .collect()
            .await;
        all.push((target.clone(), given));
    }
    all
}

fn answer_of(r: proto::CompletionResponse, target: &str) -> Answer {
    use proto::{FinishReason as F, Tier as T};
    let served = r
        .served_by
        .as_ref()
        .map(|s| format!("{}/{}", s.provider, s.model))
        .unwrap_or_default();
    let live = matches!(
        T::try_from(r.tier),
        Ok(T::Primary | T::Fallback | T::Downshift)
    ) && served == target;
    Answer {
        text: r.text,
        tool_calls: r
            .tool_calls
            .into_iter()
            .map(|c| (c.name, c.arguments))
            .collect(),
        refused: matches!(
            F::try_from(r.finish_reason),
            Ok(F::Refusal | F::ContentFilter)
        ),
        error: None,
        live,
    }
}

/// Each target's similarity to the first target, case by case, and how it
/// was measured: by embedding when an embedder answers for every answer,
/// else lexically.
async fn similarities(
    answers: &[(String, Vec<Answer>)],
    embedder: Option<&Embedder>,
) -> (&'static str, Vec<Vec<f64>>) {
    let Some((_, reference)) = answers.first() else {
        return ("lexical", Vec::new());
    };
    if let Some(e) = embedder {
        let mut vectors: Vec<Vec<Option<Vec<f32>>>> = Vec::new();
        for (_, given) in answers {
            let mut v = Vec::new();
            for a in given {
                v.push(e.embed(&comparable(a)).await);
            }
            vectors.push(v);
        }
        let complete = vectors.iter().flatten().all(Option::is_some);
        if complete {
            let sims = vectors
                .iter()
                .map(|v| {
                    v.iter()
                        .zip(&vectors[0])
                        .map(|(a, b)| match (a, b) {
                            (Some(a), Some(b)) => {
                                f64::from(switchyard::semantic::index::cosine(a, b))
                            }
                            _ => 0.0,
                        })
                        .collect()
                })
                .collect();
            return ("embedding", sims);
        }
        tracing::warn!("the embedder did not answer for every answer: similarity is lexical");
    }
    let sims = answers
        .iter()
        .map(|(_, given)| {
            given
                .iter()
                .zip(reference)
                .map(|(a, r)| judge::lexical_similarity(&comparable(a), &comparable(r)))
                .collect()
        })
        .collect();
    ("lexical", sims)
}

fn count(n: u32, ok: u32) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{ok}/{n}")
    }
}

/// The table (or the record as JSON).
fn print(out: &mut (dyn Write + Send), record: &RouteValidation, json: bool) {
    if json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(record).unwrap_or_default()
        );
        return;
    }
    let _ = writeln!(
        out,
        "\n| target | validated | structured output | refusal agreement | tool calls | similarity |"
    );
    let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- |");
    for t in &record.targets {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.3} ({}) |",
            t.target,
            if t.validated { "yes" } else { "NO" },
            count(t.schema_cases, t.schema_valid),
            count(t.refusal_cases, t.refusal_agreed),
            count(t.tool_cases, t.tool_agreed),
            t.answer_similarity,
            t.similarity_kind
        );
    }
    let failed: Vec<&TargetValidation> = record.targets.iter().filter(|t| !t.validated).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailures:");
        for t in failed {
            for f in &t.failures {
                let _ = writeln!(out, "  {}: {f}", t.target);
            }
        }
    }
}

/// Sends the record to the Switchyard under test and writes `--record`.
async fn store(
    session: &Session,
    record: &RouteValidation,
    file: Option<&PathBuf>,
    out: &mut (dyn Write + Send),
) -> Result<(), GoldenError> {
    let json = serde_json::to_string(record).map_err(|e| GoldenError::Remote(e.to_string()))?;
    if let Some(path) = file {
        Records::store(path, record.clone())
            .map_err(|e| GoldenError::Usage(format!("--record: {e}")))?;
        let _ = writeln!(out, "record written to {}", path.display());
    }
    let Ok(channel) = &session.channel else {
        return Err(GoldenError::Remote("not connected".into()));
    };
    let mut admin = proto::admin_client::AdminClient::new(channel.clone());
    let req = session.request(
        proto::RecordValidationRequest { record_json: json },
        session.admin.as_ref(),
    );
    match admin.record_validation(req).await {
        Ok(r) => {
            let _ = writeln!(
                out,
                "validation recorded{}",
                if r.into_inner().persisted {
                    " (and written to the server's [golden] record file)"
                } else {
                    " in the server's memory (it has no [golden] record file)"
                }
            );
            Ok(())
        }
        Err(s) => Err(GoldenError::Remote(format!(
            "RecordValidation: {:?}: {}",
            s.code(),
            s.message()
        ))),
    }
}

/// A bearer token from an environment variable, if one is named.
fn token(env: Option<&str>) -> Result<Option<String>, GoldenError> {
    match env {
        None => Ok(None),
        Some(var) => std::env::var(var)
            .map(Some)
            .map_err(|_| GoldenError::Usage(format!("environment variable {var} is not set"))),
    }
}
