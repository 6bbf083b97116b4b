//! Streams that survive their caller: every streamed event is numbered and
//! journaled; a caller that drops its stream resumes it from the last event
//! it holds (by `ResumeCompletion` with the resume token, or by the same
//! request with the same idempotency key and `resume_after_seq` /
//! `Last-Event-ID`), on this replica or another one on the same Redis, and
//! gets the rest: no duplicated, no lost text, one upstream generation.
//! Tokens are bound to their tenant; a stream past its journal bound says
//! `resumable = false`; a keyless stream whose caller leaves is cancelled.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;
use switchyard::proto::completion_event::Event;
use tonic::Code;

const TOKENS: &str = "alpha:alpha-token-0000000000,beta:beta-token-00000000000";
const ALPHA: &str = "alpha-token-0000000000";
const BETA: &str = "beta-token-00000000000";

/// 40 tokens, 25 ms apart: a stream long enough to drop in the middle.
const MOCK: &[&str] = &["--tokens", "40", "--token-delay-ms", "25"];

fn full_text(n: u32) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

fn config(head: &str, mock: &Mock) -> String {
    format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n{head}\n{}{}",
        provider("p", "openai", &mock.base_url(), "m"),
        route("chat", &["p/m"])
    )
}

fn as_tenant<T>(token: &str, body: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

fn keyed(key: &str) -> proto::CompletionRequest {
    proto::CompletionRequest {
        idempotency_key: key.into(),
        max_tokens: 40,
        ..request("chat")
    }
}

/// What a caller read of a stream before it dropped it.
struct Partial {
    token: String,
    header_token: Option<String>,
    text: String,
    seqs: Vec<u64>,
}

/// Opens a stream as `tenant`, reads `events` events (Started and deltas),
/// then drops the call as a lost connection would.
async fn read_then_drop(
    sy: &Switchyard,
    tenant: &str,
    req: proto::CompletionRequest,
    events: usize,
) -> Partial {
    let mut client = sy.client().await;
    let response = client
        .stream_completion(as_tenant(tenant, req))
        .await
        .unwrap();
    let header_token = response
        .metadata()
        .get("x-switchyard-resume-token")
        .map(|v| v.to_str().unwrap().to_string());
    let mut s = response.into_inner();
    let mut out = Partial {
        token: String::new(),
        header_token,
        text: String::new(),
        seqs: Vec::new(),
    };
    while out.seqs.len() < events {
        let ev = s.message().await.unwrap().expect("an event");
        out.seqs.push(ev.seq);
        match ev.event {
            Some(Event::Started(st)) => out.token = st.resume_token.into(),
            Some(Event::Delta(d)) => out.text.push_str(&d.text),
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(s);
    drop(client);
    out
}

/// The rest of a stream, from `ResumeCompletion` or a reconnect.
#[derive(Default)]
struct Rest {
    seqs: Vec<u64>,
    text: String,
    continued: Vec<proto::Continued>,
    finished: Option<proto::Finished>,
    status: Option<tonic::Status>,
}

async fn read_rest(mut s: tonic::Streaming<proto::CompletionEvent>) -> Rest {
    let mut out = Rest::default();
    loop {
        match s.message().await {
            Ok(Some(ev)) => {
                out.seqs.push(ev.seq);
                match ev.event {
                    Some(Event::Delta(d)) => out.text.push_str(&d.text),
                    Some(Event::Finished(f)) => out.finished = Some(f),
                    Some(Event::Continued(c)) => out.continued.push(c),
                    _ => {}
                }
            }
            Ok(None) => return out,
            Err(status) => {
                out.status = Some(status);
                return out;
            }
        }
    }
}

async fn resume(
    sy: &Switchyard,
    tenant: &str,
    token: &str,
    after_seq: u64,
) -> Result<Rest, tonic::Status> {
    let mut client = sy.client().await;
    let s = client
        .resume_completion(as_tenant(
            tenant,
            proto::ResumeRequest {
                resume_token: token.into(),
                after_seq,
                tenant: String::new(),
            },
        ))
        .await?
        .into_inner();
    Ok(read_rest(s).await)
}

#[tokio::test]
async fn a_dropped_grpc_stream_resumes_by_its_token_with_nothing_lost_or_repeated() {
    let mock = Mock::start("openai", MOCK).await;
    let sy = Switchyard::start_with(&config("", &mock), &[("SY_TEST_TOKENS", TOKENS)]).await;

    // Started + 5 deltas, then the connection is lost.
    let first = read_then_drop(&sy, ALPHA, keyed("k-grpc"), 6).await;
    assert_eq!(first.seqs, [1, 2, 3, 4, 5, 6], "numbered from 1, no gaps");
    assert_eq!(first.token.len(), 22, "Started names the journal");
    assert_eq!(first.header_token.as_deref(), Some(first.token.as_str()));
    assert_eq!(first.text, full_text(5));

    let rest = resume(&sy, ALPHA, &first.token, 6).await.unwrap();
    assert!(rest.status.is_none(), "{:?}", rest.status);
    assert_eq!(
        rest.seqs.first(),
        Some(&7),
        "the event after the last one held"
    );
    assert!(
        rest.seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "{:?}",
        rest.seqs
    );
    assert_eq!(
        format!("{}{}", first.text, rest.text),
        full_text(40),
        "no duplicated and no lost characters at the seam"
    );
    let f = rest.finished.expect("Finished");
    assert!(f.resumable, "the whole stream was journaled");
    assert_eq!(f.usage.unwrap().output_tokens, 40);

    // After its last event nothing follows: an empty stream, not an error.
    let last = *rest.seqs.last().unwrap();
    let nothing = resume(&sy, ALPHA, &first.token, last).await.unwrap();
    assert!(nothing.status.is_none(), "{:?}", nothing.status);
    assert!(nothing.seqs.is_empty());

    // Resuming again from the start gives the same stream again.
    let again = resume(&sy, ALPHA, &first.token, 0).await.unwrap();
    assert_eq!(again.seqs.first(), Some(&1));
    assert_eq!(again.text, full_text(40));

    assert_eq!(
        mock.requests().await.len(),
        1,
        "one generation: the keyed stream finished into its journal, nothing was asked twice"
    );
}

#[tokio::test]
async fn a_resume_token_is_its_tenants_alone() {
    let mock = Mock::start("openai", MOCK).await;
    let sy = Switchyard::start_with(&config("", &mock), &[("SY_TEST_TOKENS", TOKENS)]).await;
    let first = read_then_drop(&sy, ALPHA, keyed("k-wall"), 3).await;

    let status = resume(&sy, BETA, &first.token, 0)
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(reason(&status), "RESUME_NOT_FOUND");
    assert!(!status.message().contains(&first.token), "{status:?}");

    for junk in ["", "not-a-token", &"A".repeat(22)] {
        let status = resume(&sy, ALPHA, junk, 0).await.err().expect("refused");
        assert_eq!(status.code(), Code::NotFound, "{junk}: {status:?}");
        assert_eq!(reason(&status), "RESUME_NOT_FOUND");
    }
    // The owner still gets it.
    let rest = resume(&sy, ALPHA, &first.token, 3).await.unwrap();
    assert!(rest.finished.is_some(), "{:?}", rest.status);
}

#[tokio::test]
async fn the_same_key_with_resume_after_seq_reconnects_instead_of_answering_in_use() {
    let mock = Mock::start("openai", MOCK).await;
    let sy = Switchyard::start_with(&config("", &mock), &[("SY_TEST_TOKENS", TOKENS)]).await;
    let first = read_then_drop(&sy, ALPHA, keyed("k-again"), 4).await;

    // The same request, same key, without resume_after_seq: in use.
    let got = stream(&mut sy.client().await, as_tenant(ALPHA, keyed("k-again"))).await;
    let status = got.status.expect("refused while in flight");
    assert_eq!(reason(&status), "IDEMPOTENCY_KEY_IN_USE", "{status:?}");

    let mut client = sy.client().await;
    let s = client
        .stream_completion(as_tenant(
            ALPHA,
            proto::CompletionRequest {
                resume_after_seq: Some(4),
                ..keyed("k-again")
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let rest = read_rest(s).await;
    assert!(rest.status.is_none(), "{:?}", rest.status);
    assert_eq!(rest.seqs.first(), Some(&5));
    assert_eq!(format!("{}{}", first.text, rest.text), full_text(40));
    assert_eq!(mock.requests().await.len(), 1);

    // Once it finished, a reconnect still gets the rest (from the journal).
    let s = client
        .stream_completion(as_tenant(
            ALPHA,
            proto::CompletionRequest {
                resume_after_seq: Some(30),
                ..keyed("k-again")
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let tail = read_rest(s).await;
    assert_eq!(tail.seqs.first(), Some(&31));
    assert!(tail.finished.is_some());
    assert_eq!(mock.requests().await.len(), 1);

    // A reconnect for a key that names nothing is refused, not run again.
    let got = stream(
        &mut client,
        as_tenant(
            ALPHA,
            proto::CompletionRequest {
                resume_after_seq: Some(3),
                ..keyed("k-never")
            },
        ),
    )
    .await;
    assert_eq!(reason(&got.status.expect("refused")), "RESUME_NOT_FOUND");
    assert_eq!(mock.requests().await.len(), 1);
}

/// The SSE frames of a body: (id, data) of each, in order.
fn sse(body: &str) -> Vec<(Option<u64>, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse().unwrap());
                }
                if let Some(v) = line.strip_prefix("data: ") {
                    data = v.to_string();
                }
            }
            (id, data)
        })
        .collect()
}

fn chunk_text(data: &str) -> String {
    serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_openai_stream_reconnects_with_last_event_id_and_the_same_idempotency_key() {
    let mock = Mock::start("openai", MOCK).await;
    let sy = Switchyard::start_with(&config("", &mock), &[("SY_TEST_TOKENS", TOKENS)]).await;
    let url = format!("{}/v1/chat/completions", sy.http_url());
    let http = reqwest::Client::new();
    let body = json!({"model": "chat", "stream": true, "max_tokens": 40,
                      "messages": [{"role": "user", "content": "hello"}]});

    // Read until event 5 has arrived, then drop the connection.
    let mut r = http
        .post(&url)
        .bearer_auth(ALPHA)
        .header("idempotency-key", "k-http")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let token = r.headers()["x-switchyard-resume-token"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(token.len(), 22);
    let mut got = String::new();
    let mut held: Vec<(Option<u64>, String)> = Vec::new();
    while held.last().is_none_or(|(id, _)| id.is_none_or(|id| id < 5)) {
        let bytes = r.chunk().await.unwrap().expect("more frames");
        got.push_str(std::str::from_utf8(&bytes).unwrap());
        // Only whole frames count as held.
        let whole = &got[..got.rfind("\n\n").map_or(0, |i| i + 2)];
        held = sse(whole);
    }
    drop(r);
    let last_id = held.iter().filter_map(|(id, _)| *id).max().unwrap();
    assert!(
        held.iter().all(|(id, _)| id.is_some()),
        "every frame has an id: {held:?}"
    );
    let before: String = held.iter().map(|(_, d)| chunk_text(d)).collect();

    let r = http
        .post(&url)
        .bearer_auth(ALPHA)
        .header("idempotency-key", "k-http")
        .header("last-event-id", last_id.to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rest = sse(&r.text().await.unwrap());
    assert_eq!(rest.last().unwrap().1, "[DONE]");
    let ids: Vec<u64> = rest.iter().filter_map(|(id, _)| *id).collect();
    assert!(
        ids.iter().all(|&id| id > last_id),
        "only what follows {last_id}: {ids:?}"
    );
    let after: String = rest.iter().map(|(_, d)| chunk_text(d)).collect();
    assert_eq!(format!("{before}{after}"), full_text(40));
    assert_eq!(mock.requests().await.len(), 1, "one generation");

    // A Last-Event-ID that is not an event id is refused by name.
    let r = http
        .post(&url)
        .bearer_auth(ALPHA)
        .header("idempotency-key", "k-http")
        .header("last-event-id", "yesterday")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("Last-Event-ID"));
}

#[tokio::test]
async fn a_stream_past_its_journal_bound_says_it_is_not_resumable() {
    let mock = Mock::start("openai", &["--tokens", "40"]).await;
    let sy = Switchyard::start_with(
        &config("[resume]\nmax_bytes_per_stream = 1024", &mock),
        &[("SY_TEST_TOKENS", TOKENS)],
    )
    .await;
    let mut client = sy.client().await;
    let got = stream(&mut client, as_tenant(ALPHA, keyed("k-big"))).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(
        got.text,
        full_text(40),
        "the caller still gets the whole answer"
    );
    assert!(!f.resumable, "told, not cut silently");
    let token = &got.started[0].resume_token;
    let status = resume(&sy, ALPHA, token, 0).await.err().expect("refused");
    assert_eq!(reason(&status), "STREAM_NOT_RESUMABLE", "{status:?}");
    assert_eq!(status.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn a_keyless_stream_is_cancelled_when_its_caller_leaves_and_a_reconnect_says_so() {
    let mock = Mock::start("openai", &["--tokens", "400", "--token-delay-ms", "25"]).await;
    // One USD an output token: the bill tells what was charged.
    let priced = config("", &mock).replace(
        "context_tokens = 128000",
        "context_tokens = 128000\n  price = { input_per_mtok = 0.0, output_per_mtok = 1000000.0 }",
    );
    let sy = Switchyard::start_with(&priced, &[("SY_TEST_TOKENS", TOKENS)]).await;
    let req = proto::CompletionRequest {
        max_tokens: 400,
        ..request("chat")
    };
    let first = read_then_drop(&sy, ALPHA, req, 4).await;
    let resumed =
        tokio::time::timeout(Duration::from_secs(10), resume(&sy, ALPHA, &first.token, 4))
            .await
            .expect("a cancelled stream is told at once, not after a lease");
    // The cancellation is the stream's last item: a plain status when it is
    // the first one after the caller's position, else the stream's end.
    let (status, text) = match resumed {
        Err(status) => (status, String::new()),
        Ok(rest) => (rest.status.expect("ends with its cancellation"), rest.text),
    };
    assert_eq!(reason(&status), "STREAM_CANCELLED", "{status:?}");
    assert_eq!(status.code(), Code::Cancelled);
    assert!(
        text.len() < full_text(400).len() - first.text.len(),
        "the generation stopped early"
    );
    // The upstream was asked once and its answer was not read to the end.
    assert_eq!(mock.requests().await.len(), 1);
    // What streamed is billed: not zero, not the 400 tokens asked for.
    let (_, metrics) = sy.admin_get("/metrics").await;
    let billed = metric_sum(&metrics, "switchyard_cost_usd_total");
    assert!(billed > 0.0 && billed < 100.0, "billed {billed} USD");
}

#[tokio::test]
async fn a_stream_started_on_one_replica_resumes_on_another() {
    let Some(redis) = RedisServer::start("resume fleet").await else {
        return;
    };
    let head = "[state]\nbackend = \"redis\"";
    let (ma, mb) = (
        Mock::start("openai", MOCK).await,
        Mock::start("openai", MOCK).await,
    );
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_TEST_TOKENS", TOKENS.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Switchyard::start_with(&config(head, &ma), &env).await;
    let b = Switchyard::start_with(&config(head, &mb), &env).await;

    let first = read_then_drop(&a, ALPHA, keyed("k-fleet"), 5).await;
    let rest = resume(&b, ALPHA, &first.token, 5).await.unwrap();
    assert!(rest.status.is_none(), "{:?}", rest.status);
    assert_eq!(rest.seqs.first(), Some(&6));
    assert_eq!(format!("{}{}", first.text, rest.text), full_text(40));
    assert!(rest.finished.unwrap().resumable);
    assert_eq!(ma.requests().await.len(), 1);
    assert_eq!(
        mb.requests().await.len(),
        0,
        "the other replica only read the journal"
    );

    // Another tenant on the other replica: NOT_FOUND, never the stream.
    let status = resume(&b, BETA, &first.token, 0)
        .await
        .err()
        .expect("refused");
    assert_eq!(reason(&status), "RESUME_NOT_FOUND");
}

#[tokio::test]
async fn a_stream_whose_replica_is_killed_is_taken_over_and_continued_on_another() {
    let Some(redis) = RedisServer::start("resume takeover").await else {
        return;
    };
    // A short lease, so the dead replica's journal is orphaned within a second.
    let head = "[state]\nbackend = \"redis\"\nlease = \"1s\"";
    // OpenAI-compatible servers (vLLM-like) whose model continues a prefill.
    let continuing = |mock: &Mock| {
        config(head, mock).replace(
            "capabilities = [\"chat\", \"stream\", \"tools\", \"json\"]",
            "capabilities = [\"chat\", \"stream\", \"continuation\"]",
        )
    };
    let ma = Mock::start("openai", &["--tokens", "40", "--token-delay-ms", "100"]).await;
    let mb = Mock::start("openai", MOCK).await;
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_TEST_TOKENS", TOKENS.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut a = Switchyard::start_with(&continuing(&ma), &env).await;
    let b = Switchyard::start_with(&continuing(&mb), &env).await;

    let first = read_then_drop(&a, ALPHA, keyed("k-takeover"), 6).await;
    // The replica dies mid-stream, as on node loss.
    a.child.start_kill().unwrap();
    a.child.wait().await.unwrap();

    let rest = resume(&b, ALPHA, &first.token, 6).await.unwrap();
    assert!(rest.status.is_none(), "{:?}\n{}", rest.status, b.logs());
    assert_eq!(
        format!("{}{}", first.text, rest.text),
        full_text(40),
        "one answer: what the dead replica sent, then the continuation"
    );
    assert!(
        rest.seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "{:?}",
        rest.seqs
    );
    assert_eq!(rest.continued.len(), 1, "a Continued event at the seam");
    assert_eq!(rest.continued[0].provider, "p");
    assert!(rest.finished.is_some());

    assert_eq!(ma.requests().await.len(), 1);
    let log = mb.requests().await;
    assert_eq!(log.len(), 1, "the other replica generated only the rest");
    let body = &log[0]["body"];
    assert_eq!(body["continue_final_message"], true);
    let prefill = body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(prefill["role"], "assistant");
    assert!(
        prefill["content"]
            .as_str()
            .unwrap()
            .starts_with("tok0 tok1 tok2 tok3 tok4"),
        "{prefill}"
    );

    // Read again from the start: the whole stream, one answer.
    let again = resume(&b, ALPHA, &first.token, 0).await.unwrap();
    assert_eq!(again.text, full_text(40));
}

/// Streams `req` as alpha to its end: its text, its resume token, and the
/// `Moved` event's position if the replica moved it.
async fn until_end_or_moved(
    sy_grpc: String,
    req: proto::CompletionRequest,
) -> (String, String, Option<u64>) {
    let mut client = proto::router_client::RouterClient::connect(format!("http://{sy_grpc}"))
        .await
        .unwrap();
    let mut s = client
        .stream_completion(as_tenant(ALPHA, req))
        .await
        .unwrap()
        .into_inner();
    let (mut text, mut token) = (String::new(), String::new());
    loop {
        match s.message().await {
            Ok(Some(ev)) => match ev.event {
                Some(Event::Started(st)) => token = st.resume_token.into(),
                Some(Event::Delta(d)) => text.push_str(&d.text),
                Some(Event::Moved(m)) => {
                    assert_eq!(m.resume_token, token);
                    assert_eq!(m.after_seq, ev.seq);
                    return (text, token, Some(m.after_seq));
                }
                Some(Event::Finished(_)) => return (text, token, None),
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("the stream ended without Finished or Moved: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_rolling_restart_moves_fifty_long_streams_to_the_other_replica_whole() {
    let Some(redis) = RedisServer::start("resume rolling restart").await else {
        return;
    };
    let head = "[state]\nbackend = \"redis\"\nlease = \"1s\"";
    let replica = |mock: &Mock| {
        config(head, mock)
            .replace(
                "[server]\nhttp_listen = \"127.0.0.1:0\"\n",
                "[server]\nhttp_listen = \"127.0.0.1:0\"\ndrain_timeout = \"1s\"\n",
            )
            .replace(
                "capabilities = [\"chat\", \"stream\", \"tools\", \"json\"]",
                "capabilities = [\"chat\", \"stream\", \"continuation\"]",
            )
    };
    let ma = Mock::start("openai", &["--tokens", "40", "--token-delay-ms", "100"]).await;
    let mb = Mock::start("openai", &["--tokens", "40", "--token-delay-ms", "10"]).await;
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_TEST_TOKENS", TOKENS.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Switchyard::start_with(&replica(&ma), &env).await;
    let b = Switchyard::start_with(&replica(&mb), &env).await;

    const STREAMS: usize = 50;
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            tokio::spawn(until_end_or_moved(
                a.grpc.clone(),
                keyed(&format!("k-roll-{i}")),
            ))
        })
        .collect();
    ma.wait_for("every stream under way", |log| log.len() == STREAMS)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The rolling restart: SIGTERM, a drain of one second, then the pod is gone.
    let pid = a.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());

    let mut resumed = Vec::new();
    let b = &b;
    for s in streams {
        let (text, token, moved) = s.await.unwrap();
        let after = moved.expect("a long stream is moved, not failed, when its replica leaves");
        resumed.push(async move {
            let rest = resume(b, ALPHA, &token, after).await.unwrap();
            assert!(rest.status.is_none(), "{:?}", rest.status);
            format!("{text}{}", rest.text)
        });
    }
    for answer in futures_util::future::join_all(resumed).await {
        assert_eq!(answer, full_text(40), "every answer whole");
    }
    assert_eq!(ma.requests().await.len(), STREAMS);
    let log = mb.requests().await;
    assert_eq!(
        log.len(),
        STREAMS,
        "one continuation per stream, no generation twice"
    );
    assert!(log
        .iter()
        .all(|r| r["body"]["continue_final_message"] == true));
}

#[tokio::test]
async fn the_official_openai_sdk_resumes_a_dropped_stream_with_last_event_id() {
    if !python_ready(
        "openai",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let mock = Mock::start("openai", MOCK).await;
    let open = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}",
        provider("p", "openai", &mock.base_url(), "m"),
        route("chat", &["p/m"])
    );
    let sy = Switchyard::start(&open).await;
    let expected = full_text(40);
    let (out, stdout, stderr) = run_example(
        "python3",
        "examples/openai_sdk/test_resume.py",
        &[
            "--base-url",
            &format!("{}/v1", sy.http_url()),
            "--expected",
            &expected,
        ],
    )
    .await;
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", sy.logs());
    assert_eq!(stdout.matches("PASS ").count(), 3, "{stdout}");
    assert_eq!(mock.requests().await.len(), 1, "one generation");
}

#[tokio::test]
async fn a_token_past_its_ttl_is_not_found_as_expired() {
    let mock = Mock::start("openai", &[]).await;
    let sy = Switchyard::start_with(
        &config("[resume]\nttl = \"1s\"", &mock),
        &[("SY_TEST_TOKENS", TOKENS)],
    )
    .await;
    let got = stream(&mut sy.client().await, as_tenant(ALPHA, keyed("k-ttl"))).await;
    let token = got.started[0].resume_token.clone();
    assert!(got.finished.unwrap().resumable);
    assert!(
        resume(&sy, ALPHA, &token, 0).await.is_ok(),
        "alive within its ttl"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = resume(&sy, ALPHA, &token, 0).await.err().expect("expired");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(reason(&status), "RESUME_EXPIRED");
}

#[tokio::test]
async fn past_resume_max_streams_a_new_stream_is_served_unjournaled_and_says_so() {
    let mock = Mock::start("openai", MOCK).await;
    let sy = Switchyard::start_with(
        &config("[resume]\nmax_streams = 1", &mock),
        &[("SY_TEST_TOKENS", TOKENS)],
    )
    .await;
    let mut client = sy.client().await;
    let first = tokio::spawn({
        let mut client = client.clone();
        async move { stream(&mut client, as_tenant(ALPHA, keyed("k-slot-1"))).await }
    });
    mock.wait_for("the first stream under way", |l| l.len() == 1)
        .await;
    let second = stream(&mut client, as_tenant(ALPHA, keyed("k-slot-2"))).await;
    let first = first.await.unwrap();
    assert_eq!(second.text, full_text(40), "served whole all the same");
    assert!(second.started[0].resume_token.is_empty(), "no journal");
    assert!(!second.finished.unwrap().resumable, "and it says so");
    assert!(first.finished.unwrap().resumable);
    // The slot is free again once the first stream ended.
    let third = stream(&mut client, as_tenant(ALPHA, keyed("k-slot-3"))).await;
    assert!(third.finished.unwrap().resumable);
}
