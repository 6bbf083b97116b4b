//! What a request costs its tenant: the hold of its maximum cost against the
//! tenant's cap before the first attempt (more held as failed attempts
//! bill), the settlement to what it really cost, and the prices and rough
//! token estimates those sums come from. The ledger (`state::cost`) keeps
//! the books and decides what its outage does.

use std::time::Duration;

use tokio::time::Instant;

use super::Tasks;
use crate::actors::registry::ProviderEntry;
use crate::actors::router::Plan;
use crate::chat::{ChatRequest, Usage};
use crate::embeddings::EmbedSpec;
use crate::error::RequestError;
use crate::request::RequestSpec;
use crate::state::cost::{OnOutage, Reservation};

/// How long a hold outlives the request's deadline, so a live request never loses it.
const HOLD_MARGIN: Duration = Duration::from_secs(30);

/// What one request holds against its tenant's cap and has spent so far.
pub(super) struct Bill<'a> {
    tenant: &'a str,
    /// The request's deadline (a hold outlives it by a margin).
    pub(super) deadline: Instant,
    held: Vec<Reservation>,
    spent: f64,
    /// What a hold does while the fleet ledger is away (the route's `fail_closed`).
    on_outage: OnOutage,
}

impl Bill<'_> {
    /// Adds what the request spent (an answer, or output before a failure).
    pub(super) fn spend(&mut self, usd: f64) {
        self.spent += usd;
    }
}

/// What a hold does while the fleet ledger is away: the route's `fail_closed`.
fn on_outage(plan: &Plan) -> OnOutage {
    if plan.fail_closed {
        OnOutage::Refuse
    } else {
        OnOutage::Allowance
    }
}

impl Tasks {
    /// Holds the request's maximum cost against the tenant's cap, at the
    /// dearest candidate: the prompt estimate at the dearest input rate it
    /// may be billed at there (a cache write of the whole prompt, at the
    /// longest marked TTL's price on an Anthropic target; on an upstream
    /// that caches on its own, whichever of input, read and write is
    /// dearest) plus `max_tokens` (else the model's context) at its output
    /// price. It settles to the real, cache-aware cost.
    pub(super) async fn reserve<'a>(
        &self,
        spec: &'a RequestSpec,
        plan: &Plan,
        deadline: Instant,
    ) -> Result<Bill<'a>, RequestError> {
        let mut bill = Bill {
            tenant: &spec.tenant,
            deadline,
            held: Vec::new(),
            spent: 0.0,
            on_outage: on_outage(plan),
        };
        if !self.cost.has_cap(&spec.tenant) {
            return Ok(bill);
        }
        let prompt = prompt_tokens(&spec.chat);
        let marked = spec.chat.longest_cache_ttl();
        let asked = spec.chat.max_tokens.or(plan.default_max_tokens);
        let max_usd = plan
            .candidates
            .iter()
            .filter_map(|c| {
                let entry = self.actors.provider(&c.provider)?;
                let model = entry.runtime.model(&c.model)?;
                let output = asked.unwrap_or(model.context_tokens.saturating_sub(prompt));
                let dialect = entry.runtime.kind.dialect();
                Some(model.price.max_cost(dialect, marked, prompt, output))
            })
            .fold(0.0, f64::max);
        self.hold(&mut bill, max_usd).await?;
        Ok(bill)
    }

    /// Output a failed attempt was billed for: the next attempt may cost
    /// the maximum again, so that much more is held (an expensive fallback
    /// chain stops at the cap too).
    pub(super) async fn bill_failed_output(
        &self,
        bill: &mut Bill<'_>,
        usd: f64,
    ) -> Result<(), RequestError> {
        if usd <= 0.0 {
            return Ok(());
        }
        bill.spent += usd;
        if bill.held.is_empty() {
            return Ok(());
        }
        self.hold(bill, usd).await
    }

    /// Adds `usd` to what the request holds, or refuses with COST_CAP (or
    /// STATE_UNAVAILABLE on a `fail_closed` route while the ledger is away).
    async fn hold(&self, bill: &mut Bill<'_>, usd: f64) -> Result<(), RequestError> {
        let hold = bill.deadline.saturating_duration_since(Instant::now()) + HOLD_MARGIN;
        match self
            .cost
            .reserve(bill.tenant, usd, hold, bill.on_outage)
            .await
        {
            Ok(Some(r)) => {
                bill.held.push(r);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(refused) => Err(refused.into_error(bill.tenant)),
        }
    }

    /// Settles what the request held to what it really cost.
    pub(super) async fn settle(&self, mut bill: Bill<'_>) {
        let mut held = bill.held.drain(..);
        match held.next() {
            Some(first) => self.cost.settle(first, bill.spent).await,
            None => self.cost.charge(bill.tenant, bill.spent).await,
        }
        for rest in held {
            self.cost.settle(rest, 0.0).await;
        }
    }

    /// Holds an embeddings call's most likely cost (its input at the
    /// dearest candidate's input price) against the tenant's cap, or
    /// refuses with COST_CAP (or STATE_UNAVAILABLE on a `fail_closed` route
    /// while the fleet ledger is away).
    pub(super) async fn reserve_embeddings(
        &self,
        spec: &EmbedSpec,
        plan: &Plan,
        deadline: Instant,
    ) -> Result<Option<Reservation>, RequestError> {
        if !self.cost.has_cap(&spec.tenant) {
            return Ok(None);
        }
        let tokens = spec.estimated_tokens();
        let usd = plan
            .candidates
            .iter()
            .filter_map(|c| Some(price(&self.actors.provider(&c.provider)?, &c.model)))
            .map(|p| p.cost(tokens, 0))
            .fold(0.0, f64::max);
        let hold = deadline.saturating_duration_since(Instant::now()) + HOLD_MARGIN;
        self.cost
            .reserve(&spec.tenant, usd, hold, on_outage(plan))
            .await
            .map_err(|refused| refused.into_error(&spec.tenant))
    }

    /// Settles an embeddings call's hold to what it cost.
    pub(super) async fn settle_embeddings(
        &self,
        tenant: &str,
        held: Option<Reservation>,
        spent: f64,
    ) {
        match held {
            Some(r) => self.cost.settle(r, spent).await,
            None => self.cost.charge(tenant, spent).await,
        }
    }
}

/// A target's price table entry.
pub(super) fn price(entry: &ProviderEntry, model: &str) -> crate::config::Price {
    entry
        .runtime
        .model(model)
        .map(|m| m.price)
        .unwrap_or_default()
}

/// The prompt's bytes: the messages (with their roles and tool calls) and
/// the tool definitions.
pub(super) fn prompt_bytes(chat: &ChatRequest) -> usize {
    let messages: usize = chat
        .messages
        .iter()
        .map(|m| {
            m.content_bytes()
                + m.role.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    let tools: usize = chat
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    messages + tools
}

/// Rough prompt size, about four characters a token.
fn prompt_tokens(chat: &ChatRequest) -> u32 {
    u32::try_from(prompt_bytes(chat) / 4)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Rough usage when the upstream sent none: about four characters a token.
pub(super) fn estimate_usage(chat: &ChatRequest, output_chars: usize) -> Usage {
    Usage::plain(prompt_tokens(chat), output_chars.div_ceil(4) as u32)
}
