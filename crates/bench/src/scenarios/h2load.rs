//! `h2load`: the overhead seen by a load generator this crate did not write
//! (not in `all`; CI does not run it). nghttp2's h2load sends the requests
//! `overhead` sends, at 1,000 and 3,000 per second and closed loop: straight
//! to the mock's OpenAI endpoint (HTTP/1.1), and through Switchyard over gRPC
//! (h2c, the `CompletionRequest` encoded from the proto into a gRPC frame)
//! and over its OpenAI door (HTTP/1.1). Latency comes from h2load's
//! per-request log, CPU per request from Switchyard's `/proc/PID/stat`.
//!
//! h2load sees HTTP statuses only, so a gRPC error (status 200, a non-zero
//! `grpc-status` trailer) would pass it: the check that every request reached
//! the mock exactly once is what proves the gRPC answers real.

use std::path::{Path, PathBuf};

use prost::Message as _;
use serde_json::json;

use super::result;
use crate::clients::Prompt;
use crate::procs::{config_text, with_http_door, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{delta, ms, Table};
use crate::{BenchError, Check, Ctx, ScenarioResult};
use switchyard::proto;

/// Tokens the mock streams per answer, as in `overhead`.
const TOKENS: u32 = 16;

/// Where a row's load goes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Path2 {
    /// The mock's OpenAI endpoint, HTTP/1.1.
    Direct,
    /// Switchyard's gRPC port, h2c.
    Grpc,
    /// Switchyard's OpenAI door, HTTP/1.1.
    Door,
}

impl Path2 {
    fn name(self) -> &'static str {
        match self {
            Path2::Direct => "direct",
            Path2::Grpc => "grpc",
            Path2::Door => "openai door",
        }
    }
}

/// A fixed rate or a closed loop of this many callers.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Load {
    Rate(u32),
    Closed(u32),
}

/// What h2load printed, read back.
#[derive(Debug, Default, Clone, PartialEq)]
struct H2Report {
    /// `finished in ...s, R req/s`.
    rps: f64,
    done: u64,
    succeeded: u64,
    failed: u64,
    /// `status codes: N 2xx`.
    ok_2xx: u64,
}

/// One row: a path under one load.
struct Row {
    path: Path2,
    stream: bool,
    load: Load,
    report: H2Report,
    /// Per-request latency percentiles (ms) from the log file.
    p50: f64,
    p99: f64,
    /// Switchyard's CPU per answered request (µs); `None` direct.
    cpu_us: Option<f64>,
    /// Requests the mock received during the row.
    upstream: u64,
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("h2load");
    let h2load = which("h2load").ok_or_else(|| {
        BenchError::start(
            "h2load",
            "not on PATH (Debian: apt-get install nghttp2-client)",
        )
    })?;
    let mock = MockProc::start(ctx, "h2load", &MockSpec::new("openai", TOKENS, 0)).await?;
    let cfg = with_http_door(config_text(
        "",
        &[Provider::new("primary", "openai", &mock).caps(100_000, 100_000)],
        &[("chat", &["primary"])],
    ));
    let router = RouterProc::start(ctx, "h2load", &cfg).await?;
    let door = router
        .http
        .ok_or_else(|| BenchError::start("switchyard", "no http= in its banner"))?;
    let d = ctx.pick(2u32, 6);
    let loads = ctx.pick(
        vec![Load::Rate(200), Load::Closed(16)],
        vec![Load::Rate(1000), Load::Rate(3000), Load::Closed(64)],
    );
    let mut rows = Vec::new();
    for stream in [false, true] {
        let bodies = Bodies::write(ctx, stream)?;
        for load in &loads {
            for path in [Path2::Direct, Path2::Grpc, Path2::Door] {
                let target = match path {
                    Path2::Direct => {
                        Target::h1(format!("http://{}/v1/chat/completions", mock.addr))
                    }
                    Path2::Door => Target::h1(format!("http://{door}/v1/chat/completions")),
                    Path2::Grpc => Target::grpc(router.grpc, stream),
                };
                let body = if path == Path2::Grpc {
                    &bodies.grpc
                } else if path == Path2::Direct {
                    &bodies.direct
                } else {
                    &bodies.door
                };
                // Warm connections and allocators (not recorded).
                let warm = Spec {
                    target: &target,
                    body,
                    load: Load::Rate(200),
                    seconds: 1,
                    log: ctx.path("h2load-warm.log"),
                };
                run_h2load(&h2load, &warm).await?;
                let label = format!(
                    "{} {} {}",
                    path.name(),
                    if stream { "stream" } else { "unary" },
                    load_text(*load)
                );
                ctx.progress(format!("   h2load {label}"));
                let spec = Spec {
                    target: &target,
                    body,
                    load: *load,
                    seconds: d,
                    log: ctx.path(&format!(
                        "h2load-{}-{}-{}.log",
                        path.name().replace(' ', "-"),
                        if stream { "stream" } else { "unary" },
                        load_slug(*load)
                    )),
                };
                let m0 = mock.stats().await?.requests;
                let u0 = router.usage();
                let report = run_h2load(&h2load, &spec).await?;
                let u1 = router.usage();
                let m1 = mock.stats().await?.requests;
                let lat = latencies(&spec.log)?;
                let cpu_us = (path != Path2::Direct)
                    .then(|| (u1.cpu_s - u0.cpu_s) * 1e6 / report.succeeded.max(1) as f64);
                let row = Row {
                    path,
                    stream,
                    load: *load,
                    p50: percentile(&lat, 0.50),
                    p99: percentile(&lat, 0.99),
                    report,
                    cpu_us,
                    upstream: m1 - m0,
                };
                ctx.progress(format!(
                    "   h2load {label}: {:.0} req/s, {} of {} 2xx, p50 {} p99 {} ms{}",
                    row.report.rps,
                    row.report.ok_2xx,
                    row.report.done,
                    ms(row.p50),
                    ms(row.p99),
                    row.cpu_us
                        .map(|c| format!(", {c:.0} µs Switchyard CPU per request"))
                        .unwrap_or_default()
                ));
                let open = spec.concurrency();
                let r = &row.report;
                res.checks.push(Check::new(
                    format!("h2load {label}: every request answered 2xx"),
                    r.done > 0 && r.failed == 0 && within(r.ok_2xx, r.done, open),
                    format!(
                        "{} done, {} 2xx (at most {open} open at the end), {} failed",
                        r.done, r.ok_2xx, r.failed
                    ),
                ));
                res.checks.push(Check::new(
                    format!("h2load {label}: each request reached the mock exactly once"),
                    within(row.upstream, r.done, open),
                    format!(
                        "{} done, the mock received {} (at most {open} open at the end)",
                        r.done, row.upstream
                    ),
                ));
                rows.push(row);
            }
        }
    }
    router.stop().await;
    mock.stop().await;
    render(&mut res, &rows);
    Ok(res)
}

/// The request bodies of a mode, written once to files h2load reads.
struct Bodies {
    direct: PathBuf,
    door: PathBuf,
    grpc: PathBuf,
}

impl Bodies {
    fn write(ctx: &Ctx, stream: bool) -> Result<Bodies, BenchError> {
        let mode = if stream { "stream" } else { "unary" };
        let prompt = Prompt::default();
        let json = |model: &str| {
            json!({"model": model, "messages": prompt.json(), "stream": stream, "max_tokens": 1000})
                .to_string()
        };
        let write = |name: String, bytes: &[u8]| -> Result<PathBuf, BenchError> {
            let p = ctx.path(&name);
            std::fs::write(&p, bytes)
                .map_err(|e| BenchError::Io(format!("cannot write {}: {e}", p.display())))?;
            Ok(p)
        };
        Ok(Bodies {
            direct: write(format!("h2load-direct-{mode}.json"), json("m").as_bytes())?,
            door: write(format!("h2load-door-{mode}.json"), json("chat").as_bytes())?,
            grpc: write(format!("h2load-grpc-{mode}.bin"), &grpc_frame(&prompt))?,
        })
    }
}

/// A `CompletionRequest` as one uncompressed gRPC length-prefixed message.
fn grpc_frame(prompt: &Prompt) -> Vec<u8> {
    let msg = proto::CompletionRequest {
        route: "chat".into(),
        messages: prompt.proto(),
        max_tokens: 1000,
        ..Default::default()
    }
    .encode_to_vec();
    let mut frame = Vec::with_capacity(5 + msg.len());
    frame.push(0);
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    frame
}

/// Where h2load sends, and how.
struct Target {
    url: String,
    h1: bool,
    headers: Vec<String>,
}

impl Target {
    fn h1(url: String) -> Target {
        Target {
            url,
            h1: true,
            headers: vec!["content-type: application/json".into()],
        }
    }

    fn grpc(addr: std::net::SocketAddr, stream: bool) -> Target {
        let method = if stream {
            "StreamCompletion"
        } else {
            "Complete"
        };
        Target {
            url: format!("http://{addr}/switchyard.v1.Router/{method}"),
            h1: false,
            headers: vec![
                "content-type: application/grpc".into(),
                "te: trailers".into(),
                "grpc-timeout: 10S".into(),
            ],
        }
    }
}

/// One h2load run.
struct Spec<'a> {
    target: &'a Target,
    body: &'a Path,
    load: Load,
    seconds: u32,
    log: PathBuf,
}

impl Spec<'_> {
    /// h2load's arguments: HTTP/1.1 callers are one connection each, one
    /// request at a time; gRPC callers share 4 h2c connections as
    /// `overhead`'s client does. A rate is split evenly over the callers.
    fn callers(&self) -> (u32, u32) {
        match (self.load, self.target.h1) {
            (Load::Closed(n), true) => (n, 1),
            (Load::Closed(n), false) => (4, n.div_ceil(4)),
            (Load::Rate(r), true) => ((r / 50).clamp(4, 64), 1),
            (Load::Rate(_), false) => (4, 64),
        }
    }

    /// Requests that may be open at once (h2load's clients times streams):
    /// those open when the duration ends are not `done`, but may have been
    /// answered and did reach the mock.
    fn concurrency(&self) -> u64 {
        let (clients, streams) = self.callers();
        u64::from(clients * streams)
    }

    fn args(&self) -> Vec<String> {
        let (clients, streams) = self.callers();
        let mut a = vec![
            format!("--clients={clients}"),
            format!("--max-concurrent-streams={streams}"),
            "--threads=1".into(),
            format!("--duration={}", self.seconds),
            format!("--data={}", self.body.display()),
            format!("--log-file={}", self.log.display()),
        ];
        if let Load::Rate(r) = self.load {
            a.push(format!(
                "--rps={}",
                (r as f64 / clients as f64).ceil() as u32
            ));
        }
        if self.target.h1 {
            a.push("--h1".into());
        }
        for h in &self.target.headers {
            a.push(format!("--header={h}"));
        }
        a.push(self.target.url.clone());
        a
    }
}

async fn run_h2load(exe: &Path, spec: &Spec<'_>) -> Result<H2Report, BenchError> {
    let _ = std::fs::remove_file(&spec.log);
    let out = tokio::process::Command::new(exe)
        .args(spec.args())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| BenchError::start("h2load", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BenchError::start(
            "h2load",
            format!(
                "exited with {}: {}{}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    parse_report(&text)
        .ok_or_else(|| BenchError::start("h2load", format!("unexpected output: {}", text.trim())))
}

/// Reads h2load's summary: `finished in 6.00s, 2999.50 req/s, ...`,
/// `requests: N total, N started, N done, N succeeded, N failed, ...` and
/// `status codes: N 2xx, ...`.
fn parse_report(text: &str) -> Option<H2Report> {
    let mut r = H2Report::default();
    let count = |line: &str, what: &str| -> Option<u64> {
        line.split(',')
            .find(|p| p.trim().ends_with(what))
            .and_then(|p| p.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse().ok())
    };
    let mut seen = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let rps = rest.split(',').nth(1)?.split_whitespace().next()?;
            r.rps = rps.parse().ok()?;
            seen += 1;
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            let rest = format!(" {rest}");
            r.done = count(&rest, " done")?;
            r.succeeded = count(&rest, " succeeded")?;
            r.failed = count(&rest, " failed")?;
            seen += 1;
        } else if let Some(rest) = line.strip_prefix("status codes: ") {
            r.ok_2xx = count(&format!(" {rest}"), " 2xx")?;
            seen += 1;
        }
    }
    (seen == 3).then_some(r)
}

/// Per-request durations (ms) from h2load's `--log-file`: tab-separated
/// start time (µs since the epoch), status, duration (µs).
fn latencies(log: &Path) -> Result<Vec<f64>, BenchError> {
    let text = std::fs::read_to_string(log)
        .map_err(|e| BenchError::Io(format!("cannot read {}: {e}", log.display())))?;
    let mut v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse::<f64>().ok())
        .map(|us| us / 1000.0)
        .collect();
    v.sort_by(f64::total_cmp);
    Ok(v)
}

/// `n` counts the `done` requests plus at most `open` more (those still
/// open when h2load's duration ended).
fn within(n: u64, done: u64, open: u64) -> bool {
    n >= done && n <= done + open
}

/// The `q` quantile of sorted values (0 when there are none).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn load_text(load: Load) -> String {
    match load {
        Load::Rate(r) => format!("{r}/s"),
        Load::Closed(n) => format!("closed loop x{n}"),
    }
}

fn load_slug(load: Load) -> String {
    match load {
        Load::Rate(r) => format!("{r}"),
        Load::Closed(n) => format!("closed{n}"),
    }
}

/// The path on PATH of `name`, if any.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn render(res: &mut ScenarioResult, rows: &[Row]) {
    let mut t = Table::new(&[
        "mode",
        "load",
        "path",
        "achieved req/s",
        "p50 / p99 ms",
        "added p50 / p99 ms",
        "Switchyard CPU µs per request",
    ]);
    let mut data = Vec::new();
    for row in rows {
        let direct = rows
            .iter()
            .find(|r| r.path == Path2::Direct && r.stream == row.stream && r.load == row.load);
        let added = match (row.path, direct) {
            (Path2::Direct, _) | (_, None) => "-".to_string(),
            (_, Some(d)) => format!("{} / {}", delta(row.p50 - d.p50), delta(row.p99 - d.p99)),
        };
        t.row(vec![
            if row.stream { "stream" } else { "unary" }.into(),
            load_text(row.load),
            row.path.name().into(),
            format!("{:.0}", row.report.rps),
            format!("{} / {}", ms(row.p50), ms(row.p99)),
            added,
            row.cpu_us.map_or("-".into(), |c| format!("{c:.0}")),
        ]);
        data.push(json!({
            "stream": row.stream,
            "load": load_text(row.load),
            "path": row.path.name(),
            "rps": row.report.rps,
            "done": row.report.done,
            "ok_2xx": row.report.ok_2xx,
            "p50_ms": row.p50,
            "p99_ms": row.p99,
            "switchyard_cpu_us_per_request": row.cpu_us,
            "upstream_requests": row.upstream,
        }));
    }
    res.markdown = format!(
        "nghttp2's h2load (not this crate's load generator) against the mock directly \
         (HTTP/1.1) and through Switchyard (gRPC over h2c on 4 connections; the OpenAI door \
         over HTTP/1.1), {TOKENS}-token answers at once. Latency from h2load's per-request \
         log; CPU per request from Switchyard's /proc. h2load, the mock and Switchyard share \
         the machine's cores.\n\n{}",
        t.render()
    );
    res.data = json!({ "rows": data });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_h2loads_summary() {
        let text = "starting benchmark...\n\
            finished in 6.00s, 2999.50 req/s, 1.23MB/s\n\
            requests: 17997 total, 17997 started, 17997 done, 17990 succeeded, 7 failed, 7 errored, 0 timeout\n\
            status codes: 17990 2xx, 0 3xx, 0 4xx, 0 5xx\n\
            traffic: 7.38MB (7736832) total\n";
        assert_eq!(
            parse_report(text),
            Some(H2Report {
                rps: 2999.5,
                done: 17997,
                succeeded: 17990,
                failed: 7,
                ok_2xx: 17990,
            })
        );
        assert_eq!(parse_report("finished in 6.00s, 2999.50 req/s\n"), None);
    }

    #[test]
    fn a_grpc_frame_is_length_prefixed_and_decodes() {
        let f = grpc_frame(&Prompt::default());
        assert_eq!(f[0], 0, "uncompressed");
        let len = u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize;
        assert_eq!(len, f.len() - 5);
        let back = proto::CompletionRequest::decode(&f[5..]).unwrap_or_default();
        assert_eq!(back.route, "chat");
        assert_eq!(back.max_tokens, 1000);
        assert_eq!(back.messages.len(), 1);
    }

    #[test]
    fn rates_split_over_callers_and_grpc_shares_four_connections() {
        let t = Target::h1("http://x/v1/chat/completions".into());
        let body = PathBuf::from("/b");
        let spec = Spec {
            target: &t,
            body: &body,
            load: Load::Rate(3000),
            seconds: 6,
            log: "/l".into(),
        };
        let a = spec.args();
        assert!(a.contains(&"--clients=60".to_string()), "{a:?}");
        assert!(a.contains(&"--rps=50".to_string()), "{a:?}");
        assert!(a.contains(&"--h1".to_string()));
        let g = Target::grpc(
            "127.0.0.1:1".parse().unwrap_or(([127, 0, 0, 1], 1).into()),
            true,
        );
        let spec = Spec {
            target: &g,
            load: Load::Closed(64),
            ..spec
        };
        let a = spec.args();
        assert!(a.contains(&"--clients=4".to_string()));
        assert!(a.contains(&"--max-concurrent-streams=16".to_string()));
        assert!(a
            .iter()
            .any(|s| s.ends_with("/switchyard.v1.Router/StreamCompletion")));
        assert!(!a.iter().any(|s| s.starts_with("--rps")));
    }

    #[test]
    fn counts_may_exceed_done_by_the_requests_open_at_the_end() {
        assert!(within(100, 100, 16));
        assert!(within(116, 100, 16));
        assert!(
            !within(117, 100, 16),
            "a retry storm is not an open request"
        );
        assert!(
            !within(99, 100, 16),
            "a request that never reached the mock"
        );
    }

    #[test]
    fn percentiles_of_sorted_values() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }
}
