//! Slow and idle clients against the real binary (issue 24, B1/B2 and C6):
//! request bodies that stall or trickle are answered 408 and give back
//! their connection and file slot; one tenant never holds every file slot;
//! byte-less sockets are closed after the header-read timeout and make room
//! for real requests at the cap; under a low open-file limit each listener
//! keeps its share, so gRPC and the admin probes are always answered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BOUNDARY: &str = "XyZ";

/// The host:port of the HTTP doors.
fn http_addr(rig: &Rig) -> String {
    rig.http_url().trim_start_matches("http://").to_string()
}

/// A connection that sent `head` and `part` of a body, and nothing more.
async fn half_sent(addr: &str, head: &str, part: &[u8]) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(part).await.unwrap();
    tcp
}

/// A POST head declaring `length` bytes of body.
fn post(path: &str, extra: &str, length: usize) -> String {
    format!("POST {path} HTTP/1.1\r\nhost: x\r\n{extra}content-length: {length}\r\n\r\n")
}

/// The multipart head of a batch upload; the file's bytes follow.
fn upload_start() -> String {
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
    )
}

fn multipart(token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    format!("{auth}content-type: multipart/form-data; boundary={BOUNDARY}\r\n")
}

/// One whole HTTP/1 response read from `tcp` within `within`: its status,
/// head and body (`None` when none arrives in time).
async fn response(
    tcp: &mut (impl AsyncRead + Unpin),
    within: Duration,
) -> Option<(u16, String, String)> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_string();
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                let body = text[end + 4..].to_string();
                return Some((status, head, body));
            }
        }
        match tokio::time::timeout_at(deadline, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// Whether the peer closed `tcp` within `within` (EOF or reset).
async fn closed_within(tcp: &mut (impl AsyncRead + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// A whole batch upload through reqwest: its status and body.
async fn upload(base: &str, token: Option<&str>) -> (u16, String) {
    let line = json!({"custom_id": "1", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}});
    let body = format!("{}{line}\n\r\n--{BOUNDARY}--\r\n", upload_start());
    let mut r = reqwest::Client::new()
        .post(format!("{base}/v1/files"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn chat(base: &str, within: Duration) -> Result<u16, String> {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .timeout(within)
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.status().as_u16())
}

fn queue_head(dir: &std::path::Path) -> String {
    format!("[queue]\npath = \"{}\"", dir.join("q.sqlite3").display())
}

// ---- B1: stalled uploads and the file slots ---------------------------------

#[tokio::test]
async fn b1_stalled_uploads_free_their_file_slots_and_one_tenant_never_holds_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "body_read_timeout = \"4s\"\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TOKENS\"\n{}",
        queue_head(dir.path())
    );
    let rig = Rig::start(
        &head,
        "",
        &[(
            "SY_TOKENS",
            "alpha:tok-alpha-0123456789,beta:tok-beta-0123456789",
        )],
    )
    .await;
    let addr = http_addr(&rig);
    // Alpha starts four uploads of 100 kB, sends a little of each, stalls.
    let start = upload_start();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let head = post(
            "/v1/files",
            &multipart(Some("tok-alpha-0123456789")),
            100_000,
        );
        stalled.push(half_sent(&addr, &head, start.as_bytes()).await);
    }
    // Two of them are refused at once: the other two slots stay for others.
    let answers = futures_util::future::join_all(
        stalled
            .iter_mut()
            .map(|tcp| response(tcp, Duration::from_secs(2))),
    )
    .await;
    let mut busy = Vec::new();
    let mut held = Vec::new();
    for (answer, tcp) in answers.into_iter().zip(stalled) {
        match answer {
            Some((status, _, body)) => busy.push((status, body)),
            None => held.push(tcp),
        }
    }
    assert_eq!(busy.len(), 2, "alpha got every slot: {busy:?}");
    for (status, body) in &busy {
        assert_eq!(*status, 429, "{body}");
        assert!(
            body.contains("FILES_BUSY") && body.contains("other tenants"),
            "{body}"
        );
    }
    // Beta uploads while alpha's two stall.
    let base = rig.http_url();
    let (status, body) = upload(&base, Some("tok-beta-0123456789")).await;
    assert_eq!(status, 200, "{body}");
    // Alpha's stalled uploads end at the body deadline with 408, closed.
    for tcp in held.iter_mut() {
        let (status, head, body) = response(tcp, Duration::from_secs(20))
            .await
            .expect("the stalled upload is answered");
        assert_eq!(status, 408, "{head}\n{body}");
        assert!(
            head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
        assert!(body.contains("REQUEST_BODY_TIMEOUT"), "{body}");
        assert!(closed_within(tcp, Duration::from_secs(5)).await);
    }
    // And the slots are back: alpha uploads again.
    let (status, body) = upload(&base, Some("tok-alpha-0123456789")).await;
    assert_eq!(status, 200, "{body}");
}

// ---- B2: bodies that never finish, on every door ---------------------------

#[tokio::test]
async fn b2_bodies_that_never_finish_are_answered_408_on_every_door_and_free_their_connections() {
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "http_max_connections = 16\nbody_read_timeout = \"1s\"\nconnection_idle_timeout = \"60s\"\n{}",
        queue_head(dir.path())
    );
    let rig = Rig::start(&head, "", &[]).await;
    let addr = http_addr(&rig);
    let json_type = "content-type: application/json\r\n";
    let doors = [
        ("/v1/chat/completions", json_type.to_string(), 5),
        (
            "/v1/messages",
            format!("{json_type}anthropic-version: 2023-06-01\r\n"),
            5,
        ),
        ("/v1/batches", json_type.to_string(), 4),
        ("/v1/files", multipart(None), 2),
    ];
    let mut open = Vec::new();
    for (path, extra, n) in &doors {
        for _ in 0..*n {
            let tcp = half_sent(&addr, &post(path, extra, 1000), b"{\"model\": \"ch").await;
            open.push((*path, tcp));
        }
    }
    assert_eq!(open.len(), 16);
    // Every one is answered 408 after the body deadline, and closed; the
    // idle timeout (60 s) has nothing to do with it.
    let started = Instant::now();
    for (path, tcp) in open.iter_mut() {
        let (status, head, body) = response(tcp, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("{path}: no answer"));
        assert_eq!(status, 408, "{path}: {head}\n{body}");
        assert!(closed_within(tcp, Duration::from_secs(5)).await, "{path}");
    }
    println!("16 stalled bodies answered in {:?}", started.elapsed());
    // The connections are free again.
    assert_eq!(
        chat(&rig.http_url(), Duration::from_secs(10)).await,
        Ok(200)
    );
}

#[tokio::test]
async fn b2_a_body_trickled_below_the_minimum_rate_is_cut_and_a_steady_one_is_served() {
    let rig = Rig::start("body_read_timeout = \"1s\"\nbody_min_rate = 1000", "", &[]).await;
    let addr = http_addr(&rig);
    let json_type = "content-type: application/json\r\n";
    // 20 bytes every 250 ms (80 B/s): every gap is short, the rate is not.
    let slow = half_sent(
        &addr,
        &post("/v1/chat/completions", json_type, 100_000),
        b"{",
    )
    .await;
    let (mut rd, mut wr) = slow.into_split();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = sent.clone();
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if wr.write_all(&[b' '; 20]).await.is_err() {
                return;
            }
            counted.fetch_add(20, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let answer = response(&mut rd, Duration::from_secs(20)).await;
    trickle.abort();
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    let (status, _, body) = answer.expect("the trickled body is answered");
    assert_eq!(status, 408, "{body}");
    assert!(sent < 10_000, "cut after {sent} bytes, not at the end");
    // A body at 2 kB/s in four pieces is served.
    let body =
        json!({"model": "chat", "messages": [{"role": "user", "content": "x".repeat(1900)}]})
            .to_string()
            .into_bytes();
    let mut tcp = half_sent(
        &addr,
        &post("/v1/chat/completions", json_type, body.len()),
        b"",
    )
    .await;
    for piece in body.chunks(body.len().div_ceil(4)) {
        tcp.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (status, _, body) = response(&mut tcp, Duration::from_secs(20)).await.unwrap();
    assert_eq!(status, 200, "{body}");
}

// ---- C6: idle sockets, caps and the open-file limit ------------------------

/// Opens `n` byte-less connections to `addr` at once (those the server
/// cannot take in time are given up).
async fn idle_sockets(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let addr = addr.to_string();
        set.spawn(async move {
            tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr))
                .await
                .ok()?
                .ok()
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.extend(r.unwrap());
    }
    out
}

#[tokio::test]
async fn c6_a_byteless_socket_is_closed_after_the_header_read_timeout_on_every_listener() {
    let rig = Rig::start("header_read_timeout = \"500ms\"", "", &[]).await;
    let mut sockets = Vec::new();
    let listeners = [
        ("http", http_addr(&rig)),
        ("admin", rig.sy.admin.clone()),
        ("grpc", rig.sy.grpc.clone()),
    ];
    for (name, addr) in &listeners {
        sockets.push((*name, "nothing", TcpStream::connect(addr).await.unwrap()));
        // One byte of a method is no request either (gRPC's preface is
        // tonic's to time).
        if *name != "grpc" {
            let mut p = TcpStream::connect(addr).await.unwrap();
            p.write_all(b"P").await.unwrap();
            sockets.push((*name, "one byte", p));
        }
    }
    // The idle timeout is 60 s; the header-read timeout closes them.
    for (name, sent, tcp) in sockets.iter_mut() {
        assert!(
            closed_within(tcp, Duration::from_secs(8)).await,
            "{name} kept a socket that sent {sent}"
        );
    }
    // Callers that do send requests are served as ever.
    assert_eq!(rig.served_by(1).await, ["primary"]);
    assert_eq!(
        chat(&rig.http_url(), Duration::from_secs(10)).await,
        Ok(200)
    );
}

#[tokio::test]
async fn c6_idle_sockets_under_a_low_file_limit_never_starve_grpc_or_the_admin_probes() {
    let rig = Rig::start_limited("", "", "", &[], &[], Some(256)).await;
    let http = idle_sockets(&http_addr(&rig), 300).await;
    let admin = idle_sockets(&rig.sy.admin, 100).await;
    println!(
        "{} idle HTTP and {} idle admin sockets",
        http.len(),
        admin.len()
    );
    // The probes are answered.
    for path in ["/healthz", "/readyz"] {
        let r = reqwest::Client::new()
            .get(format!("http://{}{path}", rig.sy.admin))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}\n{}", rig.sy.logs()));
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    // gRPC serves, and so does the HTTP door itself.
    let served = tokio::time::timeout(Duration::from_secs(10), rig.served_by(1)).await;
    assert_eq!(served.expect("gRPC answered"), ["primary"]);
    assert_eq!(chat(&rig.http_url(), Duration::from_secs(5)).await, Ok(200));
    assert!(rig.sy.logs().contains("caps lowered"), "{}", rig.sy.logs());
    drop((http, admin));
}

#[tokio::test]
async fn c6_two_thousand_idle_connections_never_keep_a_new_request_out() {
    // The test's own sockets need room too.
    let _ = rlimit::increase_nofile_limit(8192);
    let rig = Rig::start_limited("", "", "", &[], &[], Some(1024)).await;
    let idle = idle_sockets(&http_addr(&rig), 2000).await;
    println!("{} idle sockets open", idle.len());
    let started = Instant::now();
    let status = chat(&rig.http_url(), Duration::from_secs(5)).await;
    let took = started.elapsed();
    println!("a new request after 2,000 idle connections: {status:?} in {took:?}");
    assert_eq!(status, Ok(200), "{}", rig.sy.logs());
    // The admin probe too.
    let (status, _) = rig.sy.admin_get("/healthz").await;
    assert_eq!(status, 200);
    drop(idle);
}
