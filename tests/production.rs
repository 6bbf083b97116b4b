//! Running it in production: caller authentication, TLS, input limits and
//! graceful drain on SIGTERM, against the real binary on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use switchyard::proto;
use tonic::Code;

fn one_provider(mock: &Mock) -> String {
    format!(
        "{}{}",
        provider("p", "openai", &mock.base_url(), "m"),
        route("chat", &["p/m"])
    )
}

#[tokio::test]
async fn bearer_tokens_map_callers_to_tenants() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n{}",
        one_provider(&mock)
    );
    let sy = Switchyard::start_with(
        &config,
        &[(
            "SY_TEST_TOKENS",
            "team-a:aaaaaaaaaaaaaaaaaaaaaaaa,team-b:bbbbbbbbbbbbbbbbbbbbbbbb",
        )],
    )
    .await;
    let mut client = sy.client().await;

    let s = stream(&mut client, request("chat")).await.status.unwrap();
    assert_eq!(s.code(), Code::Unauthenticated);
    let mut req = tonic::Request::new(request("chat"));
    req.metadata_mut().insert(
        "authorization",
        "Bearer wrong-wrong-wrong-wrong".parse().unwrap(),
    );
    assert_eq!(
        stream(&mut client, req).await.status.unwrap().code(),
        Code::Unauthenticated
    );
    assert!(
        mock.requests().await.is_empty(),
        "refused callers never reach an upstream"
    );

    let mut req = tonic::Request::new(request("chat"));
    req.metadata_mut().insert(
        "authorization",
        "Bearer bbbbbbbbbbbbbbbbbbbbbbbb".parse().unwrap(),
    );
    let got = stream(&mut client, req).await;
    assert!(got.finished.is_some(), "{:?}", got.status);
    assert!(
        !sy.logs().contains("bbbbbbbbbbbbbbbbbbbbbbbb"),
        "a token never appears in the logs"
    );
}

#[tokio::test]
async fn open_mode_warns_at_start() {
    let mock = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&one_provider(&mock)).await;
    let mut client = sy.client().await;
    assert!(stream(&mut client, request("chat"))
        .await
        .finished
        .is_some());
    assert!(sy.logs().contains("auth.mode = \"open\""), "{}", sy.logs());
}

#[tokio::test]
async fn oversized_and_malformed_input_gets_clear_errors_and_the_server_keeps_serving() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "[limits]\nmax_request_bytes = 4096\nmax_messages = 4\nmax_tokens = 1000\n{}",
        one_provider(&mock)
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;

    let mut big = request("chat");
    big.messages[0].content = "x".repeat(10_000);
    let s = stream(&mut client, big).await.status.unwrap();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(reason(&s), "REQUEST_TOO_LARGE");

    let mut many = request("chat");
    many.messages = vec![user("a"); 5];
    let s = stream(&mut client, many).await.status.unwrap();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("messages"), "{}", s.message());

    let s = stream(
        &mut client,
        proto::CompletionRequest {
            max_tokens: 5000,
            ..request("chat")
        },
    )
    .await
    .status
    .unwrap();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("max_tokens"));

    let mut bad_role = request("chat");
    bad_role.messages[0].role = "wizard".into();
    assert_eq!(
        stream(&mut client, bad_role).await.status.unwrap().code(),
        Code::InvalidArgument
    );

    assert!(
        mock.requests().await.is_empty(),
        "nothing invalid reached the upstream"
    );
    assert!(
        stream(&mut client, request("chat"))
            .await
            .finished
            .is_some(),
        "still serving"
    );
}

#[tokio::test]
async fn tls_callers_need_the_ca() {
    let (ca, cert, key, _) = ca_and_cert("localhost");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();

    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        dir.path().join("cert.pem").display(),
        dir.path().join("key.pem").display(),
        one_provider(&mock)
    );
    let sy = Switchyard::start(&config).await;
    let port = sy.grpc.rsplit(':').next().unwrap().to_string();

    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = proto::router_client::RouterClient::new(channel);
    let got = stream(&mut client, request("chat")).await;
    assert!(got.finished.is_some(), "{:?}", got.status);

    // Without the CA the handshake fails.
    let no_ca = tonic::transport::ClientTlsConfig::new().domain_name("localhost");
    let r = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(no_ca)
        .unwrap()
        .connect()
        .await;
    match r {
        Err(_) => {}
        Ok(channel) => {
            let mut client = proto::router_client::RouterClient::new(channel);
            assert!(
                client.complete(request("chat")).await.is_err(),
                "an unverified server must not be trusted"
            );
        }
    }
    // Plaintext is refused too.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut client = proto::router_client::RouterClient::new(channel);
        assert!(client.complete(request("chat")).await.is_err());
    }
}

#[tokio::test]
async fn sigterm_drains_streams_then_ends_the_rest_with_a_clear_error() {
    // Journaled streams still open at the drain timeout are moved (a
    // `Moved` event with their resume token: resume them on another
    // replica); without a journal they end with SERVER_DRAINING.
    for journal in [true, false] {
        sigterm_drains(journal).await;
    }
}

async fn sigterm_drains(journal: bool) {
    let mock = Mock::start("openai", &["--tokens", "400", "--token-delay-ms", "25"]).await;
    let config = format!(
        "[resume]\nenabled = {journal}\n[server]\ndrain_timeout = \"1500ms\"\n{}",
        one_provider(&mock)
    );
    let mut sy = Switchyard::start(&config).await;
    let short = {
        let mut r = request("chat");
        r.max_tokens = 20; // ~0.5 s: finishes inside the drain window
        r
    };
    let long = {
        let mut r = request("chat");
        r.max_tokens = 400; // ~10 s: outlives it
        r
    };
    let mut calls = Vec::new();
    for req in [short.clone(), short, long.clone(), long] {
        let mut client = sy.client().await;
        calls.push(tokio::spawn(async move { stream(&mut client, req).await }));
    }
    mock.wait_for("four streams in flight", |l| l.len() == 4)
        .await;
    let pid = sy.child.id().unwrap();
    let started = std::time::Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());

    let mut completed = 0;
    let mut cut = 0;
    for c in calls {
        let got = tokio::time::timeout(Duration::from_secs(15), c)
            .await
            .expect("nothing hangs")
            .unwrap();
        match (&got.finished, &got.status, &got.moved) {
            (Some(_), None, None) => completed += 1,
            (None, None, Some(m)) if journal => {
                assert_eq!(m.resume_token, got.started[0].resume_token);
                assert!(m.after_seq > 1, "{m:?}");
                cut += 1;
            }
            (None, Some(s), None) if !journal => {
                assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                assert_eq!(reason(s), "SERVER_DRAINING");
                cut += 1;
            }
            other => panic!("journal {journal}: neither finished nor a clear end: {other:?}"),
        }
    }
    assert_eq!((completed, cut), (2, 2));
    let status = tokio::time::timeout(Duration::from_secs(10), sy.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit 0 after draining: {status:?}");
    assert!(started.elapsed() < Duration::from_secs(8));
    mock.wait_for("the cut streams closed their upstream requests", |l| {
        l.iter().filter(|r| r["client_hung_up"] == true).count() == 2
    })
    .await;
}

#[tokio::test]
async fn tenants_are_limited_in_concurrency_and_rate() {
    let mock = Mock::start("openai", &["--tokens", "20", "--token-delay-ms", "20"]).await;
    let config = format!(
        "[limits]\ntenant_max_concurrent = 1\ntenant_rate_per_sec = 0.5\ntenant_burst = 3\n{}",
        one_provider(&mock)
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let as_tenant = |t: &str| {
        let mut r = request("chat");
        r.tenant = t.into();
        r
    };
    // One stream in flight for team-a; a second one at once is refused.
    let mut first = client
        .stream_completion(as_tenant("team-a"))
        .await
        .unwrap()
        .into_inner();
    let s = stream(&mut client, as_tenant("team-a"))
        .await
        .status
        .unwrap();
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert_eq!(reason(&s), "TENANT_LIMIT");
    assert_eq!(error_meta(&s, "limit").as_deref(), Some("concurrency"));
    assert!(
        stream(&mut client, as_tenant("team-b"))
            .await
            .finished
            .is_some(),
        "another tenant is not affected"
    );
    while first.message().await.unwrap().is_some() {}
    // Burst 3: the first stream and the refused one... the refused one took no token.
    assert!(stream(&mut client, as_tenant("team-a"))
        .await
        .finished
        .is_some());
    assert!(stream(&mut client, as_tenant("team-a"))
        .await
        .finished
        .is_some());
    let s = stream(&mut client, as_tenant("team-a"))
        .await
        .status
        .unwrap();
    assert_eq!(error_meta(&s, "limit").as_deref(), Some("rate"));
    use tonic_types::StatusExt;
    assert!(
        s.get_error_details().retry_info().is_some(),
        "with a retry time"
    );
}

#[tokio::test]
async fn readiness_goes_not_serving_when_no_route_can_serve() {
    let mock = Mock::start("openai", &[]).await;
    let config = one_provider(&mock).replace(
        "  [[providers.models]]",
        "breaker = { consecutive_failures = 1, open_for = \"60s\", max_open_for = \"60s\" }\n  [[providers.models]]",
    );
    let sy = Switchyard::start(&config).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(sy.channel().await);
    let check =
        |h: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>| {
            let mut h = h.clone();
            async move {
                h.check(tonic_health::pb::HealthCheckRequest {
                    service: "switchyard.v1.Router".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status
            }
        };
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(check(&mut health).await, ServingStatus::Serving as i32);
    mock.set_fault(serde_json::json!({"type": "status", "status": 500}))
        .await;
    let mut client = sy.client().await;
    assert!(stream(&mut client, request("chat")).await.status.is_some());
    for _ in 0..100 {
        if check(&mut health).await == ServingStatus::NotServing as i32 {
            let (code, _) = sy.admin_get("/readyz").await;
            assert_eq!(code, 503);
            let (code, _) = sy.admin_get("/healthz").await;
            assert_eq!(code, 200, "still alive");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("readiness never went NOT_SERVING");
}

/// A CA and a certificate it signed for `name` (PEMs: ca, cert, key).
fn ca_and_cert(
    name: &str,
) -> (
    String,
    String,
    String,
    rcgen::Issuer<'static, rcgen::KeyPair>,
) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem(), issuer)
}

async fn tls_call(port: &str, ca: &str, identity: Option<(&str, &str)>) -> Result<(), String> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let mut client = proto::router_client::RouterClient::new(channel);
    client
        .complete(request("chat"))
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn tls_certificates_reload_and_client_certificates_are_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, cert1, key1, _) = ca_and_cert("localhost");
    let (client_ca, client_cert, client_key, _) = ca_and_cert("caller");
    let (cert_path, key_path, client_ca_path) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("clients.pem"),
    );
    std::fs::write(&cert_path, &cert1).unwrap();
    std::fs::write(&key_path, &key1).unwrap();
    std::fs::write(&client_ca_path, &client_ca).unwrap();
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "[server]\nwatch_config = false\n[server.tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n{}",
        cert_path.display(),
        key_path.display(),
        client_ca_path.display(),
        one_provider(&mock)
    );
    let sy = Switchyard::start(&config).await;
    let port = sy.grpc.rsplit(':').next().unwrap().to_string();

    tls_call(&port, &ca1, Some((&client_cert, &client_key)))
        .await
        .unwrap();
    assert!(
        tls_call(&port, &ca1, None).await.is_err(),
        "a caller without a client certificate is refused"
    );
    let (_, stranger_cert, stranger_key, _) = ca_and_cert("stranger");
    assert!(
        tls_call(&port, &ca1, Some((&stranger_cert, &stranger_key)))
            .await
            .is_err(),
        "a client certificate from another CA is refused"
    );

    // Rotate the server certificate to one from a new CA and reload.
    let (ca2, cert2, key2, _) = ca_and_cert("localhost");
    std::fs::write(&cert_path, &cert2).unwrap();
    std::fs::write(&key_path, &key2).unwrap();
    let pid = sy.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let mut rotated = false;
    for _ in 0..100 {
        if tls_call(&port, &ca2, Some((&client_cert, &client_key)))
            .await
            .is_ok()
        {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        rotated,
        "new connections use the reloaded certificate: {}",
        sy.logs()
    );
    assert!(
        tls_call(&port, &ca1, Some((&client_cert, &client_key)))
            .await
            .is_err(),
        "the old one is gone"
    );
}

#[tokio::test]
async fn a_route_caps_max_tokens_below_the_global_limit() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!("{}max_tokens_limit = 100\n", one_provider(&mock));
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let s = stream(
        &mut client,
        proto::CompletionRequest {
            max_tokens: 200,
            ..request("chat")
        },
    )
    .await
    .status
    .unwrap();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(
        s.message().contains("max_tokens") && s.message().contains("100"),
        "{}",
        s.message()
    );
    assert!(mock.requests().await.is_empty());
    let ok = stream(
        &mut client,
        proto::CompletionRequest {
            max_tokens: 100,
            ..request("chat")
        },
    )
    .await;
    assert!(
        ok.finished.is_some(),
        "still serving, and at the limit is fine"
    );
}
