//! Scenario `cost`: what answering support questions costs, and how much of
//! it caching saves, through a primary blackout. A price table, one seeded
//! task sequence with repeats and near-repeats ([`mix`]), and four clients
//! side by side on the same mocks: the primary alone, static primary then
//! secondary, Switchyard with its exact cache, Switchyard with its semantic
//! cache. The primary fails every request in the middle of three phases.
//! Then an agent workload ([`agent`]): prompt-cache affinity against the
//! route's spread and against dropped cache markers.

mod agent;
mod mix;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::blackout::{blackout, by_phase, phase_index, scaled_breaker, PhaseStats, PHASES};
use super::{check_complete, check_errors, errors_json, result};
use crate::clients::{
    grpc_call, http_client, openai_ask, static_failover, Ask, Call, Grpc, Outcome, Prompt,
};
use crate::load::{open_loop, Run};
use crate::procs::{config_text, route_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{ms, pct, Table};
use crate::{BenchError, Check, Ctx, ScenarioResult};
use mix::{Kind, Task};
use switchyard::config::Price;
use switchyard_mock::RequestRecord;

const TIMEOUT: Duration = Duration::from_secs(10);
/// The task sequence's seed.
const SEED: u64 = 2026;
/// The semantic cache's similarity threshold.
const THRESHOLD: f32 = 0.9;
/// A repeat comes at least this long after the question it repeats, so the
/// first answer is stored by then.
const REPEAT_GAP: Duration = Duration::from_secs(1);
/// Tokens per answer and their spacing at the chat mocks.
const TOKENS: u32 = 64;
const TOKEN_DELAY_MS: u64 = 3;
/// The price table, USD per million tokens: the secondary is the dearer one.
const PRIMARY: Price = Price {
    input_per_mtok: 2.5,
    output_per_mtok: 10.0,
    cache_read_per_mtok: None,
    cache_write_5m_per_mtok: None,
    cache_write_1h_per_mtok: None,
};
const SECONDARY: Price = Price {
    input_per_mtok: 3.0,
    output_per_mtok: 15.0,
    cache_read_per_mtok: None,
    cache_write_5m_per_mtok: None,
    cache_write_1h_per_mtok: None,
};
const EMBEDDER: Price = Price {
    input_per_mtok: 0.02,
    output_per_mtok: 0.0,
    cache_read_per_mtok: None,
    cache_write_5m_per_mtok: None,
    cache_write_1h_per_mtok: None,
};
/// What the naive client may be answered by; the static client's order.
const NAIVE_BASES: &[Price] = &[PRIMARY];
const STATIC_BASES: &[Price] = &[PRIMARY, SECONDARY];
/// The system prompt every task carries (most of a task's input tokens).
const SYSTEM: &str = "You are the support assistant of Acme Cloud, a hosted workspace \
    for small teams. Answer in at most three short sentences, in the customer's language. \
    Name the menu path (Settings, Billing, Security, Devices) when an action is done in the \
    app. Never ask for a password, a card number or a one-time code. If a question is about \
    a refund, a chargeback or a legal matter, say that a human agent will follow up within \
    one business day and give no promise. If you are not sure, say so and link the help \
    centre.";

/// How a client's answers are billed.
#[derive(Clone, Copy)]
enum Billing {
    /// Switchyard's `Finished.cost_usd`.
    Switchyard,
    /// The answer's usage at the price of the base that answered
    /// (`attempts` counts the bases tried, in order).
    Direct(&'static [Price]),
}

/// One client's run and how it is billed.
struct Client {
    id: &'static str,
    name: &'static str,
    billing: Billing,
    run: Run,
}

fn tier(o: &Outcome) -> Option<&'static str> {
    o.answer.as_ref().and_then(|a| a.tier)
}

/// Answered from a cache tier, without an inference.
fn from_cache(o: &Outcome) -> bool {
    o.ok && matches!(tier(o), Some("TIER_CACHE" | "TIER_SEMANTIC_CACHE"))
}

/// What this answer cost in USD; a failed request costs nothing (no
/// upstream bills an error).
fn cost_usd(o: &Outcome, billing: Billing) -> f64 {
    let Some(answer) = o.answer.as_ref().filter(|_| o.ok) else {
        return 0.0;
    };
    match billing {
        Billing::Switchyard => answer.cost_usd,
        Billing::Direct(prices) => match (answer.usage, o.attempts.checked_sub(1)) {
            (Some((input, output)), Some(i)) => prices
                .get(i as usize)
                .map_or(0.0, |p| p.cost(input, output)),
            _ => 0.0,
        },
    }
}

/// Share of `outcomes`' answers that came from a cache (0 with none answered).
fn deflection<'a>(outcomes: impl Iterator<Item = &'a Outcome>) -> f64 {
    let (mut ok, mut cached) = (0usize, 0usize);
    for o in outcomes.filter(|o| o.ok) {
        ok += 1;
        cached += usize::from(from_cache(o));
    }
    if ok == 0 {
        0.0
    } else {
        cached as f64 / ok as f64
    }
}

fn price_line(p: Price) -> String {
    format!(
        "price = {{ input_per_mtok = {}, output_per_mtok = {} }}",
        p.input_per_mtok, p.output_per_mtok
    )
}

/// A synthetic probe (`max_tokens: 1`) in a chat mock's log: Switchyard's
/// breaker sent it, no client did.
fn is_probe(r: &RequestRecord) -> bool {
    r.max_tokens == Some(1)
}

/// The run's shape: quick or full.
struct Plan {
    phase: Duration,
    rate: f64,
    tasks: Arc<Vec<Task>>,
}

impl Plan {
    fn new(ctx: &Ctx) -> Plan {
        let phase = ctx.pick(Duration::from_millis(1500), Duration::from_secs(120));
        let rate = ctx.pick(20.0, 10.0);
        // As many as the open loop schedules.
        let n = (rate * (phase * 3).as_secs_f64()).round().max(1.0) as usize;
        let gap = (rate * REPEAT_GAP.as_secs_f64()).ceil() as usize;
        Plan {
            phase,
            rate,
            tasks: Arc::new(mix::tasks(n, gap, THRESHOLD, SEED)),
        }
    }

    fn task(&self, o: &Outcome) -> &Task {
        &self.tasks[o.index as usize % self.tasks.len()]
    }
}

/// What the mocks saw and did.
struct Logs {
    /// Chat requests at the primary and the secondary, probes aside.
    chat_calls: usize,
    probes: usize,
    embed_calls: usize,
    embed_tokens: u32,
    /// Fault changes during the blackout.
    flips: u32,
    /// The breaker's `open_for`, ms.
    open_ms: u128,
}

/// One client's figures, per phase and over the run.
struct Summary {
    phases: Vec<PhaseStats>,
    /// Per phase, the share of answers from a cache.
    phase_deflection: Vec<f64>,
    answered: usize,
    availability: f64,
    deflection: f64,
    /// Every answer's cost, with the semantic route's embeddings.
    usd: f64,
    cents_per_task: f64,
    cents_per_answered: f64,
    upstream_calls: u64,
}

impl Summary {
    fn of(c: &Client, phase_s: f64, extra_usd: f64) -> Summary {
        let outcomes = &c.run.outcomes;
        let answered = c.run.ok();
        let usd = outcomes.iter().map(|o| cost_usd(o, c.billing)).sum::<f64>() + extra_usd;
        let scheduled = c.run.scheduled.max(1) as f64;
        Summary {
            phases: by_phase(&c.run, phase_s),
            phase_deflection: (0..PHASES.len())
                .map(|p| deflection(outcomes.iter().filter(|o| phase_index(o.at, phase_s) == p)))
                .collect(),
            answered,
            availability: answered as f64 / scheduled,
            deflection: deflection(outcomes.iter()),
            usd,
            cents_per_task: usd * 100.0 / scheduled,
            cents_per_answered: usd * 100.0 / answered.max(1) as f64,
            upstream_calls: outcomes.iter().map(|o| u64::from(o.attempts)).sum(),
        }
    }

    fn blackout_availability(&self) -> f64 {
        self.phases[1].availability
    }
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("cost");
    let plan = Plan::new(ctx);
    let (clients, logs) = drive(ctx, &plan).await?;
    let embed_usd = EMBEDDER.cost(logs.embed_tokens, 0);
    let phase_s = plan.phase.as_secs_f64();
    let sums: Vec<Summary> = clients
        .iter()
        .map(|c| Summary::of(c, phase_s, if c.id == "semantic" { embed_usd } else { 0.0 }))
        .collect();
    let agent = agent::run(ctx, agent::Shape::new(ctx)).await?;
    res.checks = checks(&plan, &clients, &sums, &logs);
    res.checks.extend(agent.checks());
    res.targets.push(cost_order(ctx, &sums));
    res.targets.push(agent.target(ctx));
    res.markdown = format!(
        "{}\n\n{}",
        markdown(&plan, &clients, &sums, &logs),
        agent.markdown()
    );
    res.data = json!({
        "phase_s": phase_s, "rate_per_client": plan.rate, "tasks": plan.tasks.len(),
        "seed": SEED,
        "mix": mix::shares(&plan.tasks).iter().map(|(k, s)| (k.as_str().to_string(), json!(s)))
            .collect::<serde_json::Map<_, _>>(),
        "prices_usd_per_mtok": {
            "primary": [PRIMARY.input_per_mtok, PRIMARY.output_per_mtok],
            "secondary": [SECONDARY.input_per_mtok, SECONDARY.output_per_mtok],
            "embedder": [EMBEDDER.input_per_mtok, EMBEDDER.output_per_mtok],
        },
        "clients": clients.iter().zip(&sums).map(|(c, s)| client_json(&plan, c, s))
            .collect::<Vec<_>>(),
        "mock_chat_calls": logs.chat_calls, "mock_probes": logs.probes,
        "embedding_calls": logs.embed_calls, "embedding_tokens": logs.embed_tokens,
        "embedding_cost_usd": embed_usd, "fault_changes": logs.flips,
        "agent": agent.json(),
    });
    Ok(res)
}

/// The Switchyard config: three priced providers, routes `exact` and `semantic`.
fn config(primary: &MockProc, secondary: &MockProc, embedder: &MockProc, breaker: &str) -> String {
    let mut cfg = config_text(
        "",
        &[
            // Ceilings far above the load: this scenario compares cost, and
            // the clients beside it have none (a busy machine's slower
            // answers must not shed requests here).
            Provider::new("primary", "openai", primary)
                .caps(256, 256)
                .extra(breaker)
                .model_extra(price_line(PRIMARY)),
            Provider::new("secondary", "openai", secondary)
                .caps(256, 256)
                .extra(breaker)
                .model_extra(price_line(SECONDARY)),
            Provider::new("emb", "openai", embedder).model_extra(format!(
                "capabilities = [\"embeddings\"]\n{}",
                price_line(EMBEDDER)
            )),
        ],
        &[],
    );
    let targets: &[&str] = &["primary", "secondary"];
    cfg.push_str(&route_text(
        "exact",
        targets,
        "serve_fresh_within = \"10m\"\nladder = [\"fallback\", \"cache\", \"refuse\"]",
    ));
    // The embedding is awaited before routing: a generous lookup timeout
    // keeps a busy debug build from skipping the cache.
    cfg.push_str(&route_text(
        "semantic",
        targets,
        &format!(
            "semantic_cache = {{ embedder = \"emb/m\", threshold = {THRESHOLD}, \
             fresh_within = \"10m\", lookup_timeout = \"1s\" }}\n\
             ladder = [\"fallback\", \"semantic_cache\", \"refuse\"]"
        ),
    ));
    cfg
}

/// Starts the mocks and Switchyard, sends the tasks through the four
/// clients during the blackout, reads the mocks' logs and stops everything.
async fn drive(ctx: &Ctx, plan: &Plan) -> Result<([Client; 4], Logs), BenchError> {
    let spec = MockSpec::new("openai", TOKENS, TOKEN_DELAY_MS);
    let primary = MockProc::start(ctx, "cost-primary", &spec).await?;
    let secondary = MockProc::start(ctx, "cost-secondary", &spec).await?;
    let embedder = MockProc::start(ctx, "cost-embedder", &MockSpec::new("openai", 1, 0)).await?;
    let (breaker, open_ms) = scaled_breaker(plan.phase);
    let cfg = config(&primary, &secondary, &embedder, &breaker);
    let router = RouterProc::start(ctx, "cost", &cfg).await?;
    let grpc = Grpc::connect(router.grpc, 2).await?;
    let http = http_client()?;
    let (pu, su) = (primary.base_url(), secondary.base_url());
    let system: Arc<str> = SYSTEM.into();
    let prompts: Arc<Vec<Prompt>> = Arc::new(
        plan.tasks
            .iter()
            .map(|t| Prompt {
                system: Some(system.clone()),
                user: t.text.clone(),
            })
            .collect(),
    );
    let prompt = move |i: u64| prompts[i as usize % prompts.len()].clone();
    let (rate, total) = (plan.rate, plan.phase * 3);

    let naive = {
        let (http, pu, prompt) = (http.clone(), pu.clone(), prompt.clone());
        open_loop(ctx, "cost naive", rate, total, 5_000, move |i, t0| {
            let (http, pu, prompt) = (http.clone(), pu.clone(), prompt(i));
            async move {
                let ask = Ask {
                    model: "m",
                    prompt: &prompt,
                    stream: true,
                    max_tokens: 1000,
                    include_usage: true,
                };
                openai_ask(&http, &pu, &ask, t0, TIMEOUT).await
            }
        })
    };
    let fixed = {
        let (http, bases, prompt) = (http.clone(), vec![pu, su], prompt.clone());
        open_loop(ctx, "cost static", rate, total, 5_000, move |i, t0| {
            let (http, bases, prompt) = (http.clone(), bases.clone(), prompt(i));
            async move { static_failover(&http, &bases, &prompt, true, t0, TIMEOUT).await }
        })
    };
    let via = |label: &'static str, route: &'static str| {
        let (grpc, prompt) = (grpc.clone(), prompt.clone());
        open_loop(ctx, label, rate, total, 5_000, move |i, t0| {
            let grpc = grpc.clone();
            let call = Call::new(route, true, TIMEOUT).prompt(prompt(i));
            async move { grpc_call(grpc.client(i), &call, t0).await }
        })
    };
    let start = Instant::now();
    let (naive, fixed, exact, semantic, flips) = tokio::join!(
        naive,
        fixed,
        via("cost switchyard exact", "exact"),
        via("cost switchyard semantic", "semantic"),
        blackout(&primary, start, plan.phase)
    );
    let chat_logs = [primary.requests().await?, secondary.requests().await?];
    let embed_log = embedder.requests().await?;
    router.stop().await;
    primary.stop().await;
    secondary.stop().await;
    embedder.stop().await;

    let probes = chat_logs.iter().flatten().filter(|r| is_probe(r)).count();
    let logs = Logs {
        chat_calls: chat_logs.iter().flatten().count() - probes,
        probes,
        embed_calls: embed_log.len(),
        // The mock counts an input's words as its tokens.
        embed_tokens: embed_log
            .iter()
            .filter_map(|r| r.body["input"].as_str())
            .map(|s| s.split_whitespace().count() as u32)
            .sum(),
        flips: flips?,
        open_ms,
    };
    let clients = [
        Client {
            id: "naive",
            name: "naive: primary only, no retry",
            billing: Billing::Direct(NAIVE_BASES),
            run: naive,
        },
        Client {
            id: "static",
            name: "static: primary, then secondary",
            billing: Billing::Direct(STATIC_BASES),
            run: fixed,
        },
        Client {
            id: "exact",
            name: "Switchyard, exact cache",
            billing: Billing::Switchyard,
            run: exact,
        },
        Client {
            id: "semantic",
            name: "Switchyard, semantic cache",
            billing: Billing::Switchyard,
            run: semantic,
        },
    ];
    Ok((clients, logs))
}

fn client_json(plan: &Plan, c: &Client, s: &Summary) -> serde_json::Value {
    let phases: Vec<serde_json::Value> = PHASES
        .iter()
        .zip(&s.phases)
        .zip(&s.phase_deflection)
        .map(|((p, st), d)| {
            json!({
                "phase": p, "tasks": st.n, "availability": st.availability,
                "ttft_ms": st.ttft, "deflection": d,
                "upstream_calls_per_task": st.attempts_per_request,
            })
        })
        .collect();
    let hits_by_kind: serde_json::Map<String, serde_json::Value> = Kind::ALL
        .iter()
        .map(|k| {
            let hits = c
                .run
                .outcomes
                .iter()
                .filter(|o| from_cache(o) && plan.task(o).kind == *k)
                .count();
            (k.as_str().to_string(), json!(hits))
        })
        .collect();
    json!({
        "client": c.id, "name": c.name, "phases": phases,
        "tasks": c.run.scheduled, "answered": s.answered,
        "availability": s.availability, "deflection": s.deflection,
        "cost_usd": s.usd, "cost_cents_per_task": s.cents_per_task,
        "cost_cents_per_answered_task": s.cents_per_answered,
        "upstream_calls": s.upstream_calls, "cache_hits_by_kind": hits_by_kind,
        "errors": errors_json(&c.run.outcomes),
    })
}

fn markdown(plan: &Plan, clients: &[Client], sums: &[Summary], logs: &Logs) -> String {
    let mut prices = Table::new(&["model", "input USD / Mtok", "output USD / Mtok"]);
    for (name, p) in [
        ("primary/m (chat)", PRIMARY),
        ("secondary/m (chat, the dearer)", SECONDARY),
        ("emb/m (embeddings)", EMBEDDER),
    ] {
        prices.row(vec![
            name.into(),
            p.input_per_mtok.to_string(),
            p.output_per_mtok.to_string(),
        ]);
    }
    let mut summary = Table::new(&[
        "client",
        "availability",
        "cache deflection",
        "upstream chat calls",
        "cost per task",
        "cost per answered task",
        "cost per task vs static",
    ]);
    let static_cents = sums.get(1).map_or(0.0, |s| s.cents_per_task);
    let mut phases = Table::new(&[
        "client",
        "phase",
        "tasks",
        "availability",
        "TTFT p50 / p95 ms",
        "from cache",
        "upstream calls / task",
    ]);
    for (c, s) in clients.iter().zip(sums) {
        summary.row(vec![
            c.name.to_string(),
            pct(s.availability),
            pct(s.deflection),
            s.upstream_calls.to_string(),
            format!("{:.4} ¢", s.cents_per_task),
            format!("{:.4} ¢", s.cents_per_answered),
            if c.id == "static" {
                "-".into()
            } else {
                format!("{:+.1} %", (s.cents_per_task / static_cents - 1.0) * 100.0)
            },
        ]);
        for ((p, st), d) in PHASES.iter().zip(&s.phases).zip(&s.phase_deflection) {
            phases.row(vec![
                c.name.to_string(),
                p.to_string(),
                st.n.to_string(),
                pct(st.availability),
                if st.ttft.n == 0 {
                    "-".into()
                } else {
                    format!("{} / {}", ms(st.ttft.p50), ms(st.ttft.p95))
                },
                pct(*d),
                format!("{:.2}", st.attempts_per_request),
            ]);
        }
    }
    let mix_line = mix::shares(&plan.tasks)
        .iter()
        .map(|(k, s)| format!("{} {}", k.as_str(), pct(*s)))
        .collect::<Vec<_>>()
        .join(", ");
    let close_max = plan
        .tasks
        .iter()
        .filter(|t| t.kind == Kind::Close)
        .map(|t| t.similarity)
        .fold(0.0f32, f32::max);
    let phase_s = plan.phase.as_secs_f64();
    format!(
        "Three phases of {phase_s:.1} s (before, blackout, after; a full run's blackout is the \
         issue's 120 s, `--quick` shortens all three). Each client sends the same {} tasks in \
         the same order, {:.0} per second, streamed; each carries a {}-character system \
         prompt and one support question (seed {SEED}): {mix_line}, as the mock's \
         bag-of-words embedder sees them (close ones at most {close_max:.3} similar to anything \
         before them; threshold {THRESHOLD}); a repeat comes at least {:.0} s after its \
         question. Chat mocks: {TOKENS} tokens {TOKEN_DELAY_MS} ms apart; in the blackout the \
         primary answers 500, 503 or 429, rotating every 100 ms ({} changes). Switchyard: route \
         `exact` has `serve_fresh_within = \"10m\"`, route `semantic` a `semantic_cache` with \
         `fresh_within = \"10m\"` (its question's embedding is awaited before routing); \
         breakers open for {} ms, synthetic probes.\n\n{}\n\
         Cost: each answer at the price table, from the mock's usage (naive, static) or \
         Switchyard's `Finished.cost_usd` (0 for a cache hit), plus for the semantic route its \
         {} embedding calls ({:.5} ¢ in all); per task is over every task scheduled, and a \
         failed task costs nothing (no upstream bills an error), so a client that fails looks \
         cheap per task: compare per answered task. Upstream chat calls are the clients' \
         attempts, which match the {} chat calls in the mocks' logs (synthetic probes \
         besides: {}).\n\n{}\n{}",
        plan.tasks.len(),
        plan.rate,
        SYSTEM.len(),
        REPEAT_GAP.as_secs_f64(),
        logs.flips,
        logs.open_ms,
        prices.render(),
        logs.embed_calls,
        EMBEDDER.cost(logs.embed_tokens, 0) * 100.0,
        logs.chat_calls,
        logs.probes,
        summary.render(),
        phases.render(),
    )
}

/// The scenario's correctness: counts, errors, what each cache may answer,
/// prices, and the orderings the price table and the mix make certain.
fn checks(plan: &Plan, clients: &[Client], sums: &[Summary], logs: &Logs) -> Vec<Check> {
    let [naive, fixed, exact, semantic] = clients else {
        return vec![Check::new("four clients", false, "")];
    };
    let [s_naive, _, s_exact, s_semantic] = sums else {
        return vec![Check::new("four summaries", false, "")];
    };
    let kind = |o: &Outcome| plan.task(o).kind;
    let mut out: Vec<Check> = clients
        .iter()
        .map(|c| check_complete(c.name, &c.run))
        .collect();
    out.push(check_errors(naive.name, &naive.run.outcomes, &["HTTP"]));
    for c in [fixed, exact, semantic] {
        out.push(check_errors(c.name, &c.run.outcomes, &[]));
    }
    out.push(Check::new(
        "the blackout took the primary down (naive availability in it below 50 %)",
        s_naive.blackout_availability() < 0.5,
        pct(s_naive.blackout_availability()),
    ));
    for (c, s) in [(exact, s_exact), (semantic, s_semantic)] {
        out.push(Check::new(
            format!(
                "{}: blackout availability at least the naive client's",
                c.name
            ),
            s.blackout_availability() >= s_naive.blackout_availability(),
            format!(
                "{} vs {}",
                pct(s.blackout_availability()),
                pct(s_naive.blackout_availability())
            ),
        ));
    }
    out.push(Check::new(
        "cache deflection: semantic > exact > 0",
        s_semantic.deflection > s_exact.deflection && s_exact.deflection > 0.0,
        format!(
            "{} > {}",
            pct(s_semantic.deflection),
            pct(s_exact.deflection)
        ),
    ));
    let stray = |c: &Client, allowed: &[Kind]| -> Vec<Kind> {
        c.run
            .outcomes
            .iter()
            .filter(|o| from_cache(o))
            .map(kind)
            .filter(|k| !allowed.contains(k))
            .collect()
    };
    for (c, allowed) in [
        (exact, &[Kind::Repeat][..]),
        (semantic, &[Kind::Repeat, Kind::NearRepeat][..]),
    ] {
        let bad = stray(c, allowed);
        out.push(Check::new(
            format!("{}: cache answers only repeats it may answer", c.name),
            bad.is_empty(),
            format!("{} cache answers to other tasks: {bad:?}", bad.len()),
        ));
    }
    let low: Vec<f32> = semantic
        .run
        .outcomes
        .iter()
        .filter(|o| tier(o) == Some("TIER_SEMANTIC_CACHE"))
        .filter_map(|o| o.answer.as_ref().map(|a| a.cache_similarity))
        .filter(|s| *s < THRESHOLD)
        .collect();
    out.push(Check::new(
        "semantic cache hits are at least the threshold similar",
        low.is_empty(),
        format!("{} below {THRESHOLD}: {low:?}", low.len()),
    ));
    out.push(check_prices(&[exact, semantic]));
    let unpriced = [naive, fixed]
        .iter()
        .flat_map(|c| c.run.outcomes.iter())
        .filter(|o| o.ok && o.answer.as_ref().and_then(|a| a.usage).is_none())
        .count();
    out.push(Check::new(
        "every direct answer reported its usage",
        unpriced == 0,
        format!("{unpriced} without usage"),
    ));
    let attempts: u64 = clients
        .iter()
        .flat_map(|c| c.run.outcomes.iter())
        .map(|o| u64::from(o.attempts))
        .sum();
    out.push(Check::new(
        "every upstream chat call in the mocks' logs is a client's attempt",
        attempts == logs.chat_calls as u64,
        format!(
            "clients' attempts {attempts}, mocks' chat calls {} (probes aside)",
            logs.chat_calls
        ),
    ));
    let sent = semantic.run.outcomes.len();
    out.push(Check::new(
        "one embedding call per semantic-route task",
        logs.embed_calls == sent,
        format!("{} calls for {sent} tasks", logs.embed_calls),
    ));
    out
}

/// Switchyard bills a live answer at its target's price and a cache hit at 0.
/// The headline: the caches make a task cheaper. A target, not a check:
/// how many repeats find their answer stored depends on how fast answers
/// come back, so the quick run on a busy machine reports it unjudged.
fn cost_order(ctx: &Ctx, sums: &[Summary]) -> crate::Target {
    let cents = |i: usize| sums.get(i).map_or(f64::NAN, |s| s.cents_per_task);
    // In the clients' order: naive, static, exact, semantic.
    let (fixed, exact, semantic) = (cents(1), cents(2), cents(3));
    crate::Target {
        target: "cost per task: semantic < exact < static".into(),
        met: (!ctx.quick).then_some(semantic < exact && exact < fixed),
        detail: format!("{semantic:.5} < {exact:.5} < {fixed:.5} ¢"),
    }
}

fn check_prices(clients: &[&Client]) -> Check {
    let mut bad = Vec::new();
    for o in clients.iter().flat_map(|c| c.run.outcomes.iter()) {
        let Some(a) = o.answer.as_ref().filter(|_| o.ok) else {
            continue;
        };
        let expected = match (a.tier, a.usage) {
            (Some("TIER_CACHE" | "TIER_SEMANTIC_CACHE"), _) => Some(0.0),
            (Some("TIER_PRIMARY"), Some((i, out))) => Some(PRIMARY.cost(i, out)),
            (Some("TIER_FALLBACK"), Some((i, out))) => Some(SECONDARY.cost(i, out)),
            _ => None,
        };
        let close = |e: f64| (a.cost_usd - e).abs() <= 1e-9 * e.max(1e-6);
        if !expected.is_some_and(close) {
            bad.push(format!(
                "{:?} {:?}: {} vs {expected:?}",
                a.tier, a.usage, a.cost_usd
            ));
        }
    }
    Check::new(
        "Switchyard's cost_usd is the price table's (0 for cache hits)",
        bad.is_empty(),
        format!(
            "{} mismatched: {}",
            bad.len(),
            bad.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::clients::Answer;

    fn answered(
        attempts: u32,
        usage: (u32, u32),
        tier: Option<&'static str>,
        cost: f64,
    ) -> Outcome {
        Outcome {
            ok: true,
            attempts,
            answer: Some(Answer {
                usage: Some(usage),
                tier,
                cost_usd: cost,
                ..Answer::default()
            }),
            ..Outcome::default()
        }
    }

    #[test]
    fn direct_answers_are_billed_at_the_base_that_answered() {
        let first = answered(1, (1_000_000, 0), None, 0.0);
        let second = answered(2, (0, 1_000_000), None, 0.0);
        assert_eq!(cost_usd(&first, Billing::Direct(STATIC_BASES)), 2.5);
        assert_eq!(cost_usd(&second, Billing::Direct(STATIC_BASES)), 15.0);
        // More attempts than bases, or a failure: nothing to bill.
        assert_eq!(cost_usd(&second, Billing::Direct(NAIVE_BASES)), 0.0);
        let failed = Outcome {
            ok: false,
            ..first.clone()
        };
        assert_eq!(cost_usd(&failed, Billing::Direct(STATIC_BASES)), 0.0);
        let hit = answered(0, (10, 10), Some("TIER_CACHE"), 0.0);
        assert_eq!(cost_usd(&hit, Billing::Switchyard), 0.0);
        assert!(from_cache(&hit) && !from_cache(&first));
    }

    #[test]
    fn deflection_counts_answered_tasks_only() {
        let live = answered(1, (1, 1), Some("TIER_PRIMARY"), 1e-6);
        let hit = answered(0, (1, 1), Some("TIER_SEMANTIC_CACHE"), 0.0);
        let failed = Outcome::default();
        assert_eq!(deflection([&live, &hit, &failed].into_iter()), 0.5);
        assert_eq!(deflection([&failed].into_iter()), 0.0);
    }
}
