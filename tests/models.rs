//! `GET /v1/models` and `GET /v1/models/{id}` against the real binary:
//! OpenAI's shape by default, Anthropic's for a caller that sends
//! `anthropic-version` (paged by `limit` and `after_id`), a 404 in the
//! caller's shape for an unknown id, and the doors' bearer (or `x-api-key`)
//! auth in front of both.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::Value;

const TOKEN: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";

async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = reqwest::Client::new().get(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn ids(list: &Value) -> Vec<&str> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn the_list_in_openais_shape_or_anthropics() {
    let rig = Rig::start(
        "\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n",
        "",
        &[("SY_TEST_TOKENS", &format!("team-a:{TOKEN}"))],
    )
    .await;
    let url = rig.http_url();
    let bearer = format!("Bearer {TOKEN}");
    let all = [
        "chat",
        "primary/gpt-4o-mini",
        "secondary/claude-sonnet-4-5",
        "chat@primary/gpt-4o-mini",
        "chat@secondary/claude-sonnet-4-5",
    ];

    // OpenAI's shape.
    let (status, v) = get(&format!("{url}/v1/models"), &[("authorization", &bearer)]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(ids(&v), all);
    let chat = &v["data"][0];
    assert_eq!(
        (&chat["object"], &chat["owned_by"]),
        (&"model".into(), &"switchyard".into())
    );
    assert!(chat["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["data"][2]["owned_by"], "secondary");
    let (status, m) = get(
        &format!("{url}/v1/models/secondary/claude-sonnet-4-5"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!((status, m["id"].as_str()), (200, Some(all[2])));
    let (status, e) = get(
        &format!("{url}/v1/models/nope"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["code"], "UNKNOWN_ROUTE");
    assert_eq!(e["error"]["param"], "model");

    // Anthropic's shape, with Anthropic's own key header.
    let anthropic = [("anthropic-version", "2023-06-01"), ("x-api-key", TOKEN)];
    let (status, v) = get(&format!("{url}/v1/models?limit=2"), &anthropic).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(ids(&v), &all[..2]);
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["data"][0]["display_name"], "chat");
    assert!(v["data"][0]["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        (v["has_more"].as_bool(), v["first_id"].as_str()),
        (Some(true), Some("chat"))
    );
    assert_eq!(v["last_id"], "primary/gpt-4o-mini");
    let (_, v) = get(
        &format!("{url}/v1/models?limit=2&after_id=primary/gpt-4o-mini"),
        &anthropic,
    )
    .await;
    assert_eq!(
        (ids(&v), v["has_more"].as_bool()),
        (all[2..4].to_vec(), Some(true))
    );
    let (status, m) = get(&format!("{url}/v1/models/chat"), &anthropic).await;
    assert_eq!(
        (status, m["type"].as_str(), m["id"].as_str()),
        (200, Some("model"), Some("chat"))
    );
    let (status, e) = get(&format!("{url}/v1/models/nope"), &anthropic).await;
    assert_eq!(status, 404);
    assert_eq!(
        (e["type"].as_str(), e["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error"))
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("model: "),
        "{e}"
    );
    let (status, e) = get(&format!("{url}/v1/models?limit=0"), &anthropic).await;
    assert_eq!(
        (status, e["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );

    // Both shapes are behind the doors' auth.
    let (status, e) = get(&format!("{url}/v1/models"), &[]).await;
    assert_eq!(
        (status, e["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    let (status, e) = get(
        &format!("{url}/v1/models/chat"),
        &[
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "wrong-wrong-wrong-wrong"),
        ],
    )
    .await;
    assert_eq!((status, e["type"].as_str()), (401, Some("error")));
}

/// Every listed name is a `model` the doors serve: `route@provider/model`
/// runs on that route pinned to that target; a target the route does not
/// list is an unknown model.
#[tokio::test]
async fn a_listed_route_at_target_name_is_served_by_that_target() {
    let rig = Rig::start("", "", &[]).await;
    let url = rig.http_url();
    let (_, v) = get(&format!("{url}/v1/models"), &[]).await;
    let http = reqwest::Client::new();
    for id in ids(&v) {
        let r = http
            .post(format!("{url}/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": id,
                "messages": [{"role": "user", "content": "hi"}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{id}");
        let served = r.headers()["x-switchyard-served-by"]
            .to_str()
            .unwrap()
            .to_string();
        if let Some((_, target)) = id.split_once('@') {
            assert_eq!(served, target, "{id}");
        }
    }
    for unknown in ["chat@nope/gpt-4o-mini", "nope@primary/gpt-4o-mini"] {
        let r = http
            .post(format!("{url}/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": unknown,
                "messages": [{"role": "user", "content": "hi"}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{unknown}");
    }
}
