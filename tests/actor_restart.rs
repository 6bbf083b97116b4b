//! A provider actor killed in the middle of load is restarted by the
//! supervisor: no request hangs, no request fails, and no permit leaks.
//! Runs the real router in process (to reach its actors) against real mock
//! upstreams on loopback over real gRPC.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use switchyard::config::Config;
use switchyard::proto;
use switchyard_mock::{self as mock, MockArgs, MockKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_provider_actor_mid_load_loses_nothing() {
    let slow = MockArgs {
        tokens: 10,
        token_delay_ms: 20,
        ..MockArgs::default()
    };
    let primary = mock::start(slow.clone()).await.unwrap();
    let secondary = mock::start(MockArgs {
        kind: MockKind::Anthropic,
        ..slow
    })
    .await
    .unwrap();
    let config = Config::from_toml_str(&format!(
        r#"
[server]
grpc_listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[providers]]
id = "primary"
kind = "openai"
base_url = "{}"
max_concurrency = 64
failover_max_concurrency = 64
  [[providers.models]]
  name = "m"
[[providers]]
id = "secondary"
kind = "anthropic"
base_url = "{}"
max_concurrency = 64
failover_max_concurrency = 64
  [[providers.models]]
  name = "c"
[[routes]]
name = "chat"
targets = ["primary/m", "secondary/c"]
"#,
        primary.base_url(),
        secondary.base_url()
    ))
    .unwrap();
    let running = switchyard::app::start(config, None).await.unwrap();
    let addr: SocketAddr = running.grpc_addr;
    let registry = running.registry.clone();

    let mut calls = Vec::new();
    for i in 0..40 {
        calls.push(tokio::spawn(async move {
            let mut client = proto::router_client::RouterClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            let req = proto::CompletionRequest {
                route: "chat".into(),
                messages: vec![proto::Message {
                    role: "user".into(),
                    content: format!("hi {i}"),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let r = tokio::time::timeout(Duration::from_secs(20), client.complete(req)).await;
            r.expect("no request hangs")
                .expect("every request is served")
                .into_inner()
        }));
        if i == 20 {
            // Kill the primary's actor while ~20 streams are in flight through it.
            let victim = registry.provider("primary").unwrap();
            assert!(
                victim.runtime.in_flight() > 0,
                "load is flowing through the primary"
            );
            victim.actor.kill();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut served = 0;
    for c in calls {
        let r = c.await.unwrap();
        assert_eq!(r.finish_reason, proto::FinishReason::Stop as i32);
        served += 1;
    }
    assert_eq!(served, 40);

    let now = registry.provider("primary").unwrap();
    assert_eq!(
        now.runtime.in_flight(),
        0,
        "no permit leaked across the restart"
    );
    assert_eq!(
        registry.provider("secondary").unwrap().runtime.in_flight(),
        0
    );
    // The new incarnation serves.
    let mut client = proto::router_client::RouterClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let r = client
        .complete(proto::CompletionRequest {
            route: "chat".into(),
            messages: vec![proto::Message {
                role: "user".into(),
                content: "after".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.served_by.unwrap().provider, "primary");
    running.shutdown().await;
}
