//! Upstream service tiers: a route's `service_tier` reaches the providers
//! whose API takes that value (OpenAI `flex`, both `auto`) and no others,
//! and the tier that served comes back in `Finished` and on the HTTP doors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn the_route_tier_reaches_who_takes_it_and_the_served_tier_comes_back() {
    let rig = Rig::start("", "service_tier = \"flex\"", &[]).await;
    let mut client = rig.sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(
        f.service_tier, "flex",
        "OpenAI reported the tier that served"
    );
    assert_eq!(
        rig.primary.requests().await[0]["body"]["service_tier"],
        "flex"
    );

    // Failed over to Anthropic, which has no `flex`: it is not sent there.
    rig.primary
        .set_fault(json!({"type": "status", "status": 503}))
        .await;
    let got = stream(&mut client, request("chat")).await;
    let f = got.finished.unwrap();
    assert_eq!(f.served_by.unwrap().provider, "secondary");
    assert_eq!(f.service_tier, "standard");
    let sent = &rig.secondary.requests().await[0]["body"];
    assert!(sent.get("service_tier").is_none(), "{sent}");

    // The OpenAI door shows it on the completion.
    rig.primary.set_fault(json!({})).await;
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", rig.http_url()))
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["service_tier"], "flex", "{v}");
}

#[tokio::test]
async fn auto_goes_to_both_kinds_and_a_bad_tier_is_refused() {
    let rig = Rig::start("", "service_tier = \"auto\"", &[]).await;
    rig.primary
        .set_fault(json!({"type": "status", "status": 503}))
        .await;
    let got = stream(&mut rig.sy.client().await, request("chat")).await;
    let f = got.finished.unwrap();
    assert_eq!(f.service_tier, "priority", "Anthropic's usage.service_tier");
    assert_eq!(
        rig.primary.requests().await[0]["body"]["service_tier"],
        "auto"
    );
    assert_eq!(
        rig.secondary.requests().await[0]["body"]["service_tier"],
        "auto"
    );

    let text = check_config_refuses(&format!(
        "{}{}service_tier = \"turbo\"\n",
        provider("p", "openai", "http://127.0.0.1:9/v1", "m"),
        route("chat", &["p/m"])
    ));
    assert!(text.contains("routes[0].service_tier"), "{text}");
}
