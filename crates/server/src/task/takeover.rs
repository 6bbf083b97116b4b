//! Reading a stream back, and taking it over: a caller resuming a stream
//! whose replica died mid-way (its journal's lease lapsed before its end)
//! gets the stream continued on the replica it resumed on. That replica
//! claims the journal (the dead owner's late writes are fenced), reads what
//! the caller holds, and runs the stream's request again as a continuation
//! of that text (the prefill of `mid_stream = "continue"`), writing on into
//! the same journal under the numbers that follow; the resuming caller
//! simply reads on. Only a journal that keeps its request (Redis) can be
//! taken over.

use std::sync::Arc;

use tokio::time::Instant;

use super::journal::{decode, resume_error, Follower, JournalTee};
use super::{Running, Tasks};
use crate::chat::Chunk;
use crate::error::RequestError;
use crate::policy::next::Outcome;
use crate::request::RequestSpec;
use crate::sink::{Event, EventSink};
use crate::state::journal::{Claim, Owner, ResumeToken};

/// Turns a journal's stored request (an encoded `CompletionRequest`) back
/// into a routable spec; given by the app (the doors own that conversion).
pub type Decode = Arc<dyn Fn(&[u8]) -> Result<RequestSpec, RequestError> + Send + Sync>;

/// What the caller of a taken-over stream holds.
#[derive(Default)]
struct Held {
    /// The answer's text since its last `Reset`.
    text: String,
    tool_call_open: bool,
    /// The target whose output it is (`provider`, `model`).
    serving: Option<(String, String)>,
}

impl Tasks {
    /// Streams a checked journal to `sink` to its last item; when its writer
    /// died before that, takes the stream over (once) and reads on.
    pub async fn read_on(
        self: &Arc<Self>,
        mut follower: Follower,
        sink: &mut EventSink,
    ) -> Result<(), RequestError> {
        match follower.run(sink).await {
            Err(RequestError::ResumeOwnerGone) => {
                let (tenant, token) = follower.names();
                let (tenant, token) = (tenant.to_string(), token.clone());
                self.take_over(&tenant, &token).await?;
                follower.run(sink).await
            }
            other => other,
        }
    }

    /// Claims the orphaned journal and starts the request task that
    /// continues it; `Ok` too when another replica took it first or it
    /// finished meanwhile (the follower reads on either way).
    async fn take_over(
        self: &Arc<Self>,
        tenant: &str,
        token: &ResumeToken,
    ) -> Result<(), RequestError> {
        let request = self
            .journal
            .request(tenant, token)
            .await
            .map_err(resume_error)?
            .ok_or(RequestError::ResumeOwnerGone)?;
        let mut spec = (self.decode)(&request)?;
        spec.tenant = tenant.to_string();
        // The key's claim is the dead replica's: it lapses with its lease.
        spec.idempotency_key = None;
        let owner = Owner::generate();
        let last_seq = match self
            .journal
            .claim(tenant, token, &owner)
            .await
            .map_err(resume_error)?
        {
            Claim::Taken { last_seq } => last_seq,
            Claim::Held | Claim::Finished => return Ok(()),
        };
        let held = self.held(tenant, token, last_seq).await?;
        tracing::info!(
            request_id = %spec.request_id,
            route = %spec.route,
            at_seq = last_seq,
            "took over a stream whose replica stopped: continuing it"
        );
        let tee = JournalTee::adopt(
            &self.journal,
            token.clone(),
            owner,
            self.journal_lease,
            self.journal_faults.clone(),
            self.reason,
        );
        let sink = EventSink::journal_only(Box::new(tee), last_seq, held.text, held.tool_call_open);
        tokio::spawn(self.clone().continue_stream(spec, sink, held.serving));
        Ok(())
    }

    /// What the journal's readers hold up to `last_seq`.
    async fn held(
        &self,
        tenant: &str,
        token: &ResumeToken,
        last_seq: u64,
    ) -> Result<Held, RequestError> {
        let mut reader = self
            .journal
            .reader(tenant, token, 0)
            .await
            .map_err(resume_error)?;
        let mut held = Held::default();
        while reader.position() < last_seq {
            let batch = reader
                .next(std::time::Duration::ZERO)
                .await
                .map_err(resume_error)?;
            if batch.events.is_empty() {
                break;
            }
            for entry in batch.events.iter().filter(|e| e.seq <= last_seq) {
                match decode(&entry.event) {
                    Ok(Event::Started(s)) => {
                        held.serving = Some((s.provider.to_string(), s.model.to_string()))
                    }
                    Ok(Event::Continued(c)) => held.serving = Some((c.provider, c.model)),
                    Ok(Event::Reset { .. }) => {
                        held.text.clear();
                        held.tool_call_open = false;
                    }
                    Ok(Event::Chunk(Chunk::Text(t))) => {
                        held.text.push_str(&t);
                        held.tool_call_open = false;
                    }
                    Ok(Event::Chunk(Chunk::ToolCall { .. })) => held.tool_call_open = true,
                    _ => {}
                }
            }
        }
        Ok(held)
    }

    /// The taken-over stream's request task: the plan, a cost hold, then
    /// the live walk starting from the dead replica's attempt, which only a
    /// continuation can follow.
    async fn continue_stream(
        self: Arc<Self>,
        spec: RequestSpec,
        mut sink: EventSink,
        serving: Option<(String, String)>,
    ) {
        let _running = Running::count(&self.active);
        let result = async {
            let plan = self.plan(&spec).await?;
            let from = serving
                .and_then(|(p, m)| {
                    plan.candidates
                        .iter()
                        .position(|c| *c.provider == *p && *c.model == *m)
                })
                .unwrap_or(0);
            if plan.candidates.is_empty() {
                return Err(RequestError::ResumeOwnerGone);
            }
            let within = plan.deadline.unwrap_or(self.default_deadline);
            let deadline = crate::policy::clock::after(Instant::now(), within);
            sink.set_deadline(deadline);
            let mut bill = self.reserve(&spec, &plan, deadline).await?;
            let live = self
                .drive(
                    &spec,
                    &plan,
                    None,
                    &mut sink,
                    &mut bill,
                    Outcome::TakeOver { from },
                )
                .await;
            self.settle(bill).await;
            live
        }
        .await;
        if let Err(e) = result {
            if self.abort.is_cancelled() {
                sink.fail(RequestError::Draining).await;
            } else {
                sink.fail(e).await;
            }
        }
        sink.close().await;
    }
}
