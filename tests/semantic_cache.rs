//! The semantic cache against the real binary: a chat mock and an embedder
//! mock (`mock-upstream`'s deterministic `/v1/embeddings`). A near-repeat
//! question is answered from tier SEMANTIC_CACHE with its similarity and
//! age and no inference; the same question under another system prompt is
//! not; the rung serves when the live targets fail; a slow, failing or
//! killed embedder means a skipped cache, never a failed or delayed
//! request; and the cache adds nothing to time to first token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard::proto::{self, Tier};
use tonic::Code;

const SUPPORT: &str = "You are the support agent of a shoe shop.";

fn embedder(id: &str, base_url: &str) -> String {
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "openai"
base_url = "{base_url}"
  [[providers.models]]
  name = "embed-small"
  capabilities = ["embeddings"]
"#
    )
}

/// A chat mock `p/m`, an embedder mock `emb/embed-small`, and route
/// `support` with `semantic` as its semantic_cache settings; `plain` has none.
fn config(chat: &Mock, emb: &Mock, semantic: &str, ladder: &str) -> String {
    format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}ladder = {ladder}\nsemantic_cache = {{ embedder = \"emb/embed-small\", {semantic} }}\n{}",
        provider("p", "openai", &chat.base_url(), "m"),
        embedder("emb", &emb.base_url()),
        route("support", &["p/m"]),
        route("plain", &["p/m"]),
    )
}

fn ask(system: &str, question: &str) -> proto::CompletionRequest {
    let mut req = request("support");
    req.messages = vec![
        proto::Message {
            role: "system".into(),
            content: system.into(),
            ..Default::default()
        },
        user(question),
    ];
    req
}

async fn metrics(sy: &Switchyard) -> String {
    sy.admin_get("/metrics").await.1
}

/// Waits until the route's semantic cache holds `n` answers (the fill runs
/// in the background after `Finished`).
async fn wait_entries(sy: &Switchyard, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(sy).await;
        let held = metric_sum(&m, "switchyard_semantic_cache_entries{route=\"support\"}");
        if held == n {
            return;
        }
        assert!(Instant::now() < deadline, "cache holds {held}, not {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lookups(m: &str, result: &str) -> f64 {
    metric_sum(
        m,
        &format!(
            "switchyard_semantic_cache_lookups_total{{route=\"support\",result=\"{result}\"}}"
        ),
    )
}

#[tokio::test]
async fn a_near_repeat_is_answered_from_the_semantic_tier_and_another_system_prompt_is_not() {
    let chat = Mock::start("openai", &[]).await;
    let emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(
        &chat,
        &emb,
        "threshold = 0.9, fresh_within = \"10m\"",
        "[\"fallback\", \"refuse\"]",
    ))
    .await;
    let mut client = sy.client().await;

    let live = stream(&mut client, ask(SUPPORT, "What is your refund policy?")).await;
    let f = live.finished.clone().unwrap();
    assert_eq!(f.tier, Tier::Primary as i32, "{:?}", live.status);
    wait_entries(&sy, 1.0).await;
    let embeds = emb.requests().await;
    assert_eq!(embeds.len(), 1, "one embedding per question");
    assert_eq!(embeds[0]["path"], "/v1/embeddings");
    assert_eq!(embeds[0]["body"]["input"], "What is your refund policy?");
    assert_eq!(embeds[0]["body"]["model"], "embed-small");

    // The same content words, other phrasing: similarity 1 under the mock's embedder.
    let near = stream(&mut client, ask(SUPPORT, "what's the refund policy")).await;
    let g = near.finished.clone().unwrap();
    assert_eq!(g.tier, Tier::SemanticCache as i32, "{:?}", near.status);
    assert_eq!(near.started[0].tier, Tier::SemanticCache as i32);
    assert!(g.cache_similarity >= 0.9, "{}", g.cache_similarity);
    assert!(g.cache_age_ms > 0 || g.cache_similarity > 0.0);
    assert_eq!(g.attempts, 0, "no inference");
    assert_eq!(g.cost_usd, 0.0);
    assert_eq!(near.text, live.text);
    assert_eq!(chat.requests().await.len(), 1, "the hit made no chat call");

    // The same question under another system prompt never matches.
    let other = stream(
        &mut client,
        ask("You are a pirate.", "What is your refund policy?"),
    )
    .await;
    assert_eq!(other.finished.unwrap().tier, Tier::Primary as i32);
    // Nor does another question under the same one.
    let unrelated = stream(&mut client, ask(SUPPORT, "How do I reset my password?")).await;
    assert_eq!(unrelated.finished.unwrap().tier, Tier::Primary as i32);
    assert_eq!(chat.requests().await.len(), 3);

    // The OpenAI door shows the tier too.
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/chat/completions", sy.http_url()))
        .json(&json!({
            "model": "support",
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": SUPPORT},
                {"role": "user", "content": "Refund policy?"}
            ]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-switchyard-tier"], "semantic_cache");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], live.text.as_str());
    assert_eq!(chat.requests().await.len(), 3);

    assert!(
        !sy.logs().contains("Hnsw"),
        "the HNSW crate's per-index lines stay out of the log"
    );
    let m = metrics(&sy).await;
    assert_eq!(lookups(&m, "hit"), 2.0, "{m}");
    assert!(lookups(&m, "miss") >= 3.0);
    assert!(
        metric_sum(
            &m,
            "switchyard_semantic_cache_similarity_count{route=\"support\"}"
        ) >= 2.0
    );
    assert_eq!(
        metric_sum(&m, "switchyard_semantic_cache_deflected_tokens_total{route=\"support\",gen_ai_token_type=\"output\"}"),
        2.0 * f64::from(f.usage.unwrap().output_tokens)
    );
    assert!(metric_sum(&m, "switchyard_semantic_cache_embed_duration_seconds_count{route=\"support\",outcome=\"ok\"}") >= 4.0);
    assert_eq!(
        metric_sum(
            &m,
            "switchyard_requests_served_total{route=\"support\",tier=\"semantic_cache\""
        ),
        2.0
    );
}

#[tokio::test]
async fn the_rung_serves_a_near_repeat_when_the_live_targets_fail() {
    let chat = Mock::start("openai", &[]).await;
    let emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(
        &chat,
        &emb,
        "threshold = 0.8",
        "[\"fallback\", \"semantic_cache\", \"refuse\"]",
    ))
    .await;
    let mut client = sy.client().await;
    let live = stream(&mut client, ask(SUPPORT, "Do you ship to Canada?")).await;
    assert_eq!(live.finished.unwrap().tier, Tier::Primary as i32);
    wait_entries(&sy, 1.0).await;
    // Without fresh_within, a healthy route still answers live.
    let again = stream(&mut client, ask(SUPPORT, "do you ship to canada")).await;
    assert_eq!(again.finished.unwrap().tier, Tier::Primary as i32);

    chat.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let near = stream(&mut client, ask(SUPPORT, "Can you ship to Canada?")).await;
    let f = near.finished.unwrap_or_else(|| panic!("{:?}", near.status));
    assert_eq!(f.tier, Tier::SemanticCache as i32);
    assert!(f.attempts >= 1, "the live target was tried first");
    assert!(f.cache_similarity >= 0.8);
    // Serving it does not store it again: its age keeps growing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = stream(&mut client, ask(SUPPORT, "Can you ship to Canada?"))
        .await
        .finished
        .unwrap();
    assert_eq!(again.tier, Tier::SemanticCache as i32);
    assert!(again.cache_age_ms >= f.cache_age_ms + 100);
    // Nothing close enough: refused, as the ladder says.
    let s = stream(&mut client, ask(SUPPORT, "How do I reset my password?"))
        .await
        .status
        .unwrap();
    assert_eq!(s.code(), Code::Unavailable);
}

#[tokio::test]
async fn a_slow_failing_or_killed_embedder_skips_the_cache_and_never_fails_or_delays_a_request() {
    let chat = Mock::start("openai", &[]).await;
    let mut emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(
        &chat,
        &emb,
        "threshold = 0.9, fresh_within = \"10m\", lookup_timeout = \"150ms\"",
        "[\"fallback\", \"semantic_cache\", \"refuse\"]",
    ))
    .await;
    let mut client = sy.client().await;
    let live = stream(&mut client, ask(SUPPORT, "What is your refund policy?")).await;
    assert_eq!(live.finished.unwrap().tier, Tier::Primary as i32);
    wait_entries(&sy, 1.0).await;

    // Slow: the lookup gives up after its budget and the request is served live.
    emb.set_fault(json!({"type": "slow_first_token", "delay_ms": 3000}))
        .await;
    let start = Instant::now();
    let slow = stream(&mut client, ask(SUPPORT, "what's the refund policy")).await;
    assert_eq!(slow.finished.unwrap().tier, Tier::Primary as i32);
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "waited {:?} for a slow embedder",
        start.elapsed()
    );
    assert_eq!(lookups(&metrics(&sy).await, "embedder_slow"), 1.0);

    // Failing: a 500 from the embedder, the request still served.
    emb.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let failing = stream(&mut client, ask(SUPPORT, "what's the refund policy")).await;
    assert_eq!(failing.finished.unwrap().tier, Tier::Primary as i32);
    assert_eq!(lookups(&metrics(&sy).await, "embedder_unavailable"), 1.0);

    // Killed (SIGKILL): the same, and the chat target failing as well ends
    // in the ladder's refusal, not in an embedder error.
    emb.child.kill().await.unwrap();
    let killed = stream(&mut client, ask(SUPPORT, "what's the refund policy")).await;
    assert_eq!(killed.finished.unwrap().tier, Tier::Primary as i32);
    chat.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let s = stream(&mut client, ask(SUPPORT, "what's the refund policy"))
        .await
        .status
        .unwrap();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_ne!(reason(&s), "", "a classified refusal");
    let m = metrics(&sy).await;
    // The last request looked twice: before routing, and on the rung.
    assert_eq!(lookups(&m, "embedder_unavailable"), 4.0, "{m}");
    assert_eq!(lookups(&m, "hit"), 0.0);
}

#[tokio::test]
async fn the_semantic_cache_adds_nothing_to_time_to_first_token() {
    // 10 tokens 80 ms apart: a fill that buffered the answer before
    // forwarding it would delay the first token by the whole stream.
    let chat = Mock::start("openai", &["--tokens", "10", "--token-delay-ms", "80"]).await;
    let emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(
        &chat,
        &emb,
        "threshold = 0.9, fresh_within = \"10m\"",
        "[\"fallback\", \"semantic_cache\", \"refuse\"]",
    ))
    .await;
    let client = sy.client().await;
    let ttft = |route: &'static str, i: usize| {
        let mut client = client.clone();
        async move {
            let mut req = ask(SUPPORT, &format!("question number {i} about route {route}"));
            req.route = route.into();
            let start = Instant::now();
            let mut s = client.stream_completion(req).await.unwrap().into_inner();
            let mut first = None;
            let mut tier = 0;
            while let Some(ev) = s.message().await.unwrap() {
                match ev.event {
                    Some(proto::completion_event::Event::Delta(_)) => {
                        first.get_or_insert(start.elapsed());
                    }
                    Some(proto::completion_event::Event::Finished(f)) => tier = f.tier,
                    _ => {}
                }
            }
            assert_eq!(tier, Tier::Primary as i32, "every question is new");
            (first.unwrap(), start.elapsed())
        }
    };
    let mut with = Vec::new();
    let mut without = Vec::new();
    for i in 0..3 {
        with.push(ttft("support", i).await);
        without.push(ttft("plain", i).await);
    }
    assert_ttft_unchanged(with, without, "the semantic cache");
    wait_entries(&sy, 3.0).await;
}

/// The all-MiniLM-L6-v2 directory `.ci/run` prepares, or `None` after a
/// loud skip (outside CI only: under CI it must be there).
fn minilm_dir() -> Option<String> {
    let why = match std::env::var("SWITCHYARD_MINILM") {
        Ok(dir)
            if std::path::Path::new(&dir)
                .join("model.safetensors")
                .exists() =>
        {
            let probe = std::process::Command::new("python3")
                .args(["-c", "import numpy, tokenizers, safetensors"])
                .output();
            match probe {
                Ok(o) if o.status.success() => return Some(dir),
                _ => "python3 lacks numpy, tokenizers or safetensors (tests/fixtures/minilm-requirements.txt)".to_string(),
            }
        }
        Ok(dir) => format!("{dir} has no model.safetensors"),
        Err(_) => "SWITCHYARD_MINILM is not set (see .ci/run)".to_string(),
    };
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but the real sentence embedder is missing: {why}");
    }
    eprintln!("\n*** SKIPPED the all-MiniLM-L6-v2 semantic cache test: {why} ***\n");
    None
}

#[tokio::test]
async fn a_real_sentence_embedder_answers_paraphrases_and_keeps_other_questions_apart() {
    let Some(dir) = minilm_dir() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/minilm_server.py"
    );
    let _server = tokio::process::Command::new("python3")
        .args([script, &dir, &port.to_string()])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::new();
    let mut up = false;
    for _ in 0..300 {
        if http.get(format!("{base}/models")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the MiniLM server did not come up on {base}");

    let refund = "What is your refund policy?";
    let refund_again = "what is the refund policy";
    let refund_other = "Can I get a refund for my order?";
    let password = "How do I reset my password?";
    let password_again = "I forgot my password, how can I change it?";
    let near = embedding_similarity(&base, "all-minilm-l6-v2", refund, refund_again).await;
    let related = embedding_similarity(&base, "all-minilm-l6-v2", refund, refund_other).await;
    let near_password =
        embedding_similarity(&base, "all-minilm-l6-v2", password, password_again).await;
    let across = embedding_similarity(&base, "all-minilm-l6-v2", refund, password_again).await;
    eprintln!(
        "all-MiniLM-L6-v2: paraphrases {near:.3} and {near_password:.3}, a related question {related:.3}, another topic {across:.3}"
    );
    assert!(
        near > 0.85 && near_password > 0.85,
        "{near} {near_password}"
    );
    assert!(related < 0.8 && across < 0.5, "{related} {across}");

    let chat = Mock::start("openai", &[]).await;
    let config = format!(
        "{}[[providers]]\nid = \"emb\"\nkind = \"openai\"\nbase_url = \"{base}\"\n  [[providers.models]]\n  name = \"embed-small\"\n  capabilities = [\"embeddings\"]\n{}ladder = [\"fallback\", \"refuse\"]\nsemantic_cache = {{ embedder = \"emb/embed-small\", threshold = 0.85, fresh_within = \"10m\", lookup_timeout = \"2s\" }}\n",
        provider("p", "openai", &chat.base_url(), "m"),
        route("support", &["p/m"]),
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let tier = |got: &Collected| got.finished.as_ref().map(|f| f.tier);

    assert_eq!(
        tier(&stream(&mut client, ask(SUPPORT, refund)).await),
        Some(Tier::Primary as i32)
    );
    wait_entries(&sy, 1.0).await;
    let hit = stream(&mut client, ask(SUPPORT, refund_again)).await;
    let f = hit.finished.unwrap_or_else(|| panic!("{:?}", hit.status));
    assert_eq!(f.tier, Tier::SemanticCache as i32);
    assert!(
        (f.cache_similarity - near).abs() < 0.01,
        "{} vs {near}",
        f.cache_similarity
    );
    // A related but different question is not given the refund answer.
    let other = stream(&mut client, ask(SUPPORT, refund_other)).await;
    assert_eq!(tier(&other), Some(Tier::Primary as i32));
    wait_entries(&sy, 2.0).await;
    assert_eq!(
        tier(&stream(&mut client, ask(SUPPORT, password)).await),
        Some(Tier::Primary as i32)
    );
    wait_entries(&sy, 3.0).await;
    // The paraphrase finds its own question's answer, not the refund one.
    let hit = stream(&mut client, ask(SUPPORT, password_again)).await;
    let f = hit.finished.unwrap();
    assert_eq!(f.tier, Tier::SemanticCache as i32);
    assert!(
        (f.cache_similarity - near_password).abs() < 0.01,
        "{} vs {near_password}",
        f.cache_similarity
    );
    assert_eq!(
        chat.requests().await.len(),
        3,
        "two paraphrases answered without inference"
    );
}

#[tokio::test]
async fn a_lookup_never_takes_more_than_half_of_the_callers_deadline() {
    let chat = Mock::start("openai", &[]).await;
    let emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(
        &chat,
        &emb,
        "threshold = 0.9, fresh_within = \"10m\", lookup_timeout = \"5s\"",
        "[\"fallback\", \"refuse\"]",
    ))
    .await;
    let mut client = sy.client().await;
    emb.set_fault(json!({"type": "slow_first_token", "delay_ms": 4000}))
        .await;
    let mut req = tonic::Request::new(ask(SUPPORT, "What is your refund policy?"));
    req.set_timeout(Duration::from_millis(1000));
    let start = Instant::now();
    let got = stream(&mut client, req).await;
    assert_eq!(
        got.finished.map(|f| f.tier),
        Some(Tier::Primary as i32),
        "{:?}",
        got.status
    );
    assert!(
        start.elapsed() < Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(lookups(&metrics(&sy).await, "embedder_slow"), 1.0);
}
