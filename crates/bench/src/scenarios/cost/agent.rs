//! The cost scenario's agent workload (issue 25): coding-agent sessions
//! whose every turn carries one shared 6,000-token system prompt and the
//! conversation so far, through two equal Anthropic targets (each mock its
//! own prompt cache), with the warmer target failing for a few turns in the
//! middle. Three routes side by side, each over its own pair of mocks:
//! cache markers with `cache_affinity`, markers without it (the route's
//! weighted order spreads the turns), and no markers (the old behaviour,
//! when the door dropped them). Billed by Switchyard's `Finished.cost_usd`.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::procs::{config_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{pct, Table};
use crate::{BenchError, Check, Ctx, Target};
use switchyard::config::Price;
use switchyard::proto;
use switchyard::proto::router_client::RouterClient;
use tonic::transport::Channel;

/// Anthropic Sonnet's list price; cache reads, 5m writes at the defaults
/// (0.30, 3.75).
const PRICE: Price = Price {
    input_per_mtok: 3.0,
    output_per_mtok: 15.0,
    cache_read_per_mtok: None,
    cache_write_5m_per_mtok: None,
    cache_write_1h_per_mtok: None,
};
/// The shared prefix: about 6,000 tokens at the mock's four bytes a token.
const PREFIX_TOKENS: usize = 6000;
const TOKENS: u32 = 24;
const MAX_TOKENS: u32 = 64;
const TIMEOUT: Duration = Duration::from_secs(30);

/// One route of the comparison.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Affinity,
    Spread,
    Dropped,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::Affinity, Variant::Spread, Variant::Dropped];

    fn route(self) -> &'static str {
        match self {
            Variant::Affinity => "agent_affinity",
            Variant::Spread => "agent_spread",
            Variant::Dropped => "agent_dropped",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Affinity => "markers, cache_affinity",
            Variant::Spread => "markers, no affinity (weighted spread)",
            Variant::Dropped => "markers dropped (before issue 25)",
        }
    }

    /// The pair of provider ids.
    fn providers(self) -> [&'static str; 2] {
        match self {
            Variant::Affinity => ["aff_a", "aff_b"],
            Variant::Spread => ["spr_a", "spr_b"],
            Variant::Dropped => ["drop_a", "drop_b"],
        }
    }

    fn marks(self) -> bool {
        self != Variant::Dropped
    }
}

/// The workload's shape.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    sessions: usize,
    turns: usize,
    /// The warmer target fails 529 from this turn ...
    fail_from: usize,
    /// ... to this one (exclusive).
    fail_to: usize,
}

impl Shape {
    pub(super) fn new(ctx: &Ctx) -> Shape {
        let (sessions, turns) = ctx.pick((10, 10), (50, 30));
        Shape {
            sessions,
            turns,
            fail_from: turns / 2,
            fail_to: turns / 2 + turns / 6,
        }
    }
}

/// One variant's totals.
#[derive(Default, Clone)]
struct Totals {
    answered: usize,
    failed: usize,
    attempts: u64,
    usd: f64,
    input: u64,
    read: u64,
    write: u64,
    /// Turns served by the same target as the session's turn before.
    same_target: usize,
    errors: Vec<String>,
}

/// What the workload measured, for the report.
pub(super) struct Agent {
    shape: Shape,
    totals: Vec<(Variant, Totals)>,
    /// `switchyard_cache_affinity_total` by result on the affinity route.
    affinity: [f64; 3],
}

/// Starts six mocks (a pair per variant) and one Switchyard, runs the
/// sessions turn by turn, all variants at once, and stops everything.
pub(super) async fn run(ctx: &Ctx, shape: Shape) -> Result<Agent, BenchError> {
    let spec = MockSpec::new("anthropic", TOKENS, 0);
    let mut mocks = Vec::new();
    for v in Variant::ALL {
        for p in v.providers() {
            mocks.push(MockProc::start(ctx, &format!("agent-{p}"), &spec).await?);
        }
    }
    let router = RouterProc::start(ctx, "cost-agent", &config(&mocks)).await?;
    let driven = drive(&router, &mocks, shape).await;
    let metrics = scrape(&router).await;
    router.stop().await;
    for m in mocks {
        m.stop().await;
    }
    let totals = driven?;
    let affinity = ["hit", "miss", "move"].map(|r| {
        metric_sum(
            &metrics,
            &format!(
                "switchyard_cache_affinity_total{{route=\"{}\",result=\"{r}\"}}",
                Variant::Affinity.route()
            ),
        )
    });
    Ok(Agent {
        shape,
        totals,
        affinity,
    })
}

fn config(mocks: &[MockProc]) -> String {
    let price = format!(
        "price = {{ input_per_mtok = {}, output_per_mtok = {} }}",
        PRICE.input_per_mtok, PRICE.output_per_mtok
    );
    let providers: Vec<Provider> = Variant::ALL
        .iter()
        .flat_map(|v| v.providers())
        .zip(mocks)
        .map(|(id, m)| {
            Provider::new(id, "anthropic", m)
                .caps(256, 256)
                .model_extra(price.clone())
        })
        .collect();
    let mut cfg = config_text("", &providers, &[]);
    for v in Variant::ALL {
        let [a, b] = v.providers();
        cfg.push_str(&format!(
            "\n[[routes]]\nname = \"{}\"\ntargets = [{{ target = \"{a}/m\", priority = 0 }}, \
             {{ target = \"{b}/m\", priority = 0 }}]\nmax_attempts = 3\n{}\n",
            v.route(),
            if v == Variant::Affinity {
                "cache_affinity = { ttl = \"5m\" }"
            } else {
                ""
            }
        ));
    }
    cfg
}

/// The sum of the Prometheus samples whose line starts with `prefix`.
fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(router: &RouterProc) -> String {
    let url = format!("http://{}/metrics", router.admin);
    match reqwest::get(url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// One session's conversation so far.
struct Session {
    variant: Variant,
    index: usize,
    messages: Vec<proto::Message>,
    last_target: Option<String>,
}

async fn drive(
    router: &RouterProc,
    mocks: &[MockProc],
    shape: Shape,
) -> Result<Vec<(Variant, Totals)>, BenchError> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", router.grpc))
        .map_err(|e| BenchError::start("gRPC client", e))?
        .connect()
        .await
        .map_err(|e| BenchError::start("gRPC client", e))?;
    let client = RouterClient::new(ch);
    let system = system_prompt();
    let mut sessions: Vec<Session> = Variant::ALL
        .iter()
        .flat_map(|&variant| (0..shape.sessions).map(move |index| (variant, index)))
        .map(|(variant, index)| Session {
            variant,
            index,
            messages: vec![text_message("system", &system, variant.marks())],
            last_target: None,
        })
        .collect();
    let mut totals: Vec<(Variant, Totals)> = Variant::ALL
        .iter()
        .map(|&v| (v, Totals::default()))
        .collect();
    let mut failing = Vec::new();
    for turn in 0..shape.turns {
        if turn == shape.fail_from {
            failing = warmer_of_each_pair(mocks).await?;
            for m in &failing {
                mocks[*m]
                    .set_fault(&json!({"type": "status", "status": 529}))
                    .await?;
            }
        }
        if turn == shape.fail_to {
            for m in &failing {
                mocks[*m].set_fault(&json!({"type": "none"})).await?;
            }
        }
        let outcomes = join_all(
            sessions
                .iter_mut()
                .map(|s| one_turn(client.clone(), s, turn)),
        )
        .await;
        for (variant, outcome) in outcomes {
            if let Some((_, t)) = totals.iter_mut().find(|(v, _)| *v == variant) {
                t.add(outcome);
            }
        }
    }
    Ok(totals)
}

/// Of each variant's pair, the mock that has served more so far (the warm
/// one under affinity).
async fn warmer_of_each_pair(mocks: &[MockProc]) -> Result<Vec<usize>, BenchError> {
    let mut out = Vec::new();
    for pair in (0..mocks.len()).step_by(2) {
        let a = mocks[pair].requests().await?.len();
        let b = mocks[pair + 1].requests().await?.len();
        out.push(if a >= b { pair } else { pair + 1 });
    }
    Ok(out)
}

/// What one turn brought back.
enum TurnOutcome {
    Answered {
        finished: Box<proto::Finished>,
        same_target: bool,
    },
    Failed(String),
}

impl Totals {
    fn add(&mut self, o: TurnOutcome) {
        match o {
            TurnOutcome::Answered {
                finished,
                same_target,
            } => {
                self.answered += 1;
                self.attempts += u64::from(finished.attempts);
                self.usd += finished.cost_usd;
                if let Some(u) = finished.usage {
                    self.input += u64::from(u.input_tokens);
                    self.read += u64::from(u.cache_read_input_tokens);
                    self.write += u64::from(u.cache_write_input_tokens);
                }
                self.same_target += usize::from(same_target);
            }
            TurnOutcome::Failed(e) => {
                self.failed += 1;
                if self.errors.len() < 3 {
                    self.errors.push(e);
                }
            }
        }
    }

    /// Share of prompt tokens read from a cache.
    fn read_share(&self) -> f64 {
        let all = self.input + self.read + self.write;
        if all == 0 {
            0.0
        } else {
            self.read as f64 / all as f64
        }
    }
}

/// Sends the session's next user turn, a marker on it (the conversation so
/// far is cached too, as agents do), and keeps the answer in the history.
async fn one_turn(
    mut client: RouterClient<Channel>,
    s: &mut Session,
    turn: usize,
) -> (Variant, TurnOutcome) {
    let ask = format!(
        "Session {} step {turn}: run the tests of module m{} and fix the first failure.",
        s.index,
        (s.index * 31 + turn * 7) % 97
    );
    let mut messages = s.messages.clone();
    messages.push(text_message("user", &ask, s.variant.marks()));
    let req = proto::CompletionRequest {
        route: s.variant.route().into(),
        messages: messages.clone(),
        max_tokens: MAX_TOKENS,
        ..Default::default()
    };
    let outcome = match tokio::time::timeout(TIMEOUT, collect(&mut client, req)).await {
        Ok(Ok((text, finished))) => {
            let target = finished.served_by.as_ref().map(|t| t.provider.to_string());
            let same_target = s.last_target.is_some() && s.last_target == target;
            s.last_target = target;
            // The history keeps the turns unmarked: the marker moves to
            // each new last turn.
            s.messages.push(text_message("user", &ask, false));
            s.messages.push(text_message("assistant", &text, false));
            TurnOutcome::Answered {
                finished: Box::new(finished),
                same_target,
            }
        }
        Ok(Err(e)) => TurnOutcome::Failed(e),
        Err(_) => TurnOutcome::Failed("timeout".into()),
    };
    (s.variant, outcome)
}

/// A streamed call's text and `Finished`.
async fn collect(
    client: &mut RouterClient<Channel>,
    req: proto::CompletionRequest,
) -> Result<(String, proto::Finished), String> {
    use proto::completion_event::Event;
    let mut stream = client
        .stream_completion(req)
        .await
        .map_err(|s| format!("{:?} {}", s.code(), s.message()))?
        .into_inner();
    let mut text = String::new();
    loop {
        match stream.message().await {
            Ok(Some(ev)) => match ev.event {
                Some(Event::Delta(d)) => text.push_str(&d.text),
                Some(Event::Reset(_)) => text.clear(),
                Some(Event::Finished(f)) => return Ok((text, f)),
                _ => {}
            },
            Ok(None) => return Err("stream ended without Finished".into()),
            Err(s) => return Err(format!("{:?} {}", s.code(), s.message())),
        }
    }
}

fn text_message(role: &str, text: &str, marked: bool) -> proto::Message {
    proto::Message {
        role: role.into(),
        parts: vec![proto::ContentPart {
            part: Some(proto::content_part::Part::Text(text.into())),
            cache_control: marked.then(|| proto::CacheControl { ttl: "5m".into() }),
        }],
        ..Default::default()
    }
}

/// About [`PREFIX_TOKENS`] tokens of agent instructions and tool notes.
fn system_prompt() -> String {
    let line = "You are a coding agent in a large Rust repository: read before you edit, \
                run the tests you touch, keep diffs small, explain each change. ";
    let mut s = String::new();
    let mut i = 0;
    while s.len() < PREFIX_TOKENS * 4 {
        s.push_str(&format!("Rule {i}. {line}"));
        i += 1;
    }
    s
}

impl Agent {
    fn cents_per_task(&self, v: Variant) -> f64 {
        self.totals
            .iter()
            .find(|(x, _)| *x == v)
            .map_or(f64::NAN, |(_, t)| {
                t.usd * 100.0 / self.shape.sessions as f64
            })
    }

    pub(super) fn checks(&self) -> Vec<Check> {
        let mut out = Vec::new();
        let expected = self.shape.sessions * self.shape.turns;
        for (v, t) in &self.totals {
            out.push(Check::new(
                format!("agent, {}: every turn answered", v.name()),
                t.answered == expected && t.failed == 0,
                format!(
                    "{} of {expected} answered, {} failed {:?}",
                    t.answered, t.failed, t.errors
                ),
            ));
        }
        let (aff, dropped) = (
            self.cents_per_task(Variant::Affinity),
            self.cents_per_task(Variant::Dropped),
        );
        out.push(Check::new(
            "agent: cache markers make a task cheaper than dropping them",
            aff < dropped,
            format!("{aff:.4} < {dropped:.4} ¢"),
        ));
        let [hit, miss, moved] = self.affinity;
        out.push(Check::new(
            "agent: affinity hits outnumber misses and moves",
            hit > miss + moved,
            format!("hit {hit}, miss {miss}, move {moved}"),
        ));
        out
    }

    /// Affinity beats the spread: a target, since how often the weighted
    /// spread happens to land on the warm target is chance.
    pub(super) fn target(&self, ctx: &Ctx) -> Target {
        let (aff, spread) = (
            self.cents_per_task(Variant::Affinity),
            self.cents_per_task(Variant::Spread),
        );
        Target {
            target: "agent cost per task: affinity < spread".into(),
            met: (!ctx.quick).then_some(aff < spread),
            detail: format!("{aff:.4} < {spread:.4} ¢"),
        }
    }

    pub(super) fn json(&self) -> Value {
        let [hit, miss, moved] = self.affinity;
        json!({
            "sessions": self.shape.sessions, "turns": self.shape.turns,
            "prefix_tokens": PREFIX_TOKENS,
            "failing_turns": [self.shape.fail_from, self.shape.fail_to],
            "price_usd_per_mtok": [PRICE.input_per_mtok, PRICE.output_per_mtok],
            "affinity": {"hit": hit, "miss": miss, "move": moved},
            "variants": self.totals.iter().map(|(v, t)| json!({
                "route": v.route(), "name": v.name(), "answered": t.answered,
                "failed": t.failed, "attempts": t.attempts, "cost_usd": t.usd,
                "cost_cents_per_task": self.cents_per_task(*v),
                "input_tokens": t.input, "cache_read_tokens": t.read,
                "cache_write_tokens": t.write, "cache_read_share": t.read_share(),
                "same_target_turns": t.same_target,
            })).collect::<Vec<_>>(),
        })
    }

    pub(super) fn markdown(&self) -> String {
        let dropped = self.cents_per_task(Variant::Dropped);
        let mut table = Table::new(&[
            "route",
            "turns answered",
            "upstream calls",
            "prompt read from cache",
            "cache writes (tokens)",
            "same target as the turn before",
            "cost per task (session)",
            "vs markers dropped",
        ]);
        for (v, t) in &self.totals {
            let cents = self.cents_per_task(*v);
            table.row(vec![
                v.name().into(),
                t.answered.to_string(),
                t.attempts.to_string(),
                pct(t.read_share()),
                t.write.to_string(),
                pct(t.same_target as f64 / t.answered.max(1) as f64),
                format!("{cents:.3} ¢"),
                format!("{:+.1} %", (cents / dropped - 1.0) * 100.0),
            ]);
        }
        let [hit, miss, moved] = self.affinity;
        let s = self.shape;
        format!(
            "**Agent workload.** {} sessions of {} turns, all at once turn by turn; every \
             turn carries a {PREFIX_TOKENS}-token system prompt shared by all sessions and \
             the session's conversation so far, markers on the system prompt and the last \
             turn (as coding agents send them), through a route of two equal-priority \
             Anthropic targets (mocks modelling Anthropic's prompt cache, each its own) at \
             ${} / ${} per Mtok (reads 0.1x, writes 1.25x). From turn {} to {} the target \
             that had served more answers 529 (a failover in the middle). Affinity on its \
             route: {hit} hits, {miss} misses, {moved} moves. Cost per task is a session's \
             `cost_usd`.\n\n{}",
            s.sessions,
            s.turns,
            PRICE.input_per_mtok,
            PRICE.output_per_mtok,
            s.fail_from,
            s.fail_to,
            table.render(),
        )
    }
}
