//! `switchyard golden` against mocks, through the real binary: a route whose
//! targets are a good one, one that breaks the JSON schema (`off_schema`)
//! and one that refuses, plus a downshift target. The command judges every
//! target on every case (one pinned request each, no retries), exits 1,
//! stores the record (through a running Switchyard's Admin API, or in
//! process into the `[golden] record` file), `/v1/status` and
//! `ListProviders` show it, and the route's `require_validated` downshift
//! uses only a validated target.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use switchyard::proto::{self, Tier};
use tonic::Code;

const SET: &str = r#"
[[case]]
name = "status-json"
prompt = "Give the status of order 42 as JSON."
schema = { type = "object", required = ["answer"], properties = { answer = { type = "string" } } }

[[case]]
name = "lookup"
prompt = "Where is order 42?"
expect_tool = "lookup_order"
  [[case.tools]]
  name = "lookup_order"
  description = "Finds an order"
  parameters = { type = "object", required = ["query"], properties = { query = { type = "string" } } }

[[case]]
name = "greeting"
prompt = "Say hello to a customer."
refusal = false
"#;

struct Setup {
    good: Mock,
    off: Mock,
    refuser: Mock,
    cheap: Mock,
    dir: tempfile::TempDir,
    config: String,
}

async fn setup() -> Setup {
    let good = Mock::start("openai", &["--tokens", "4"]).await;
    let off = Mock::start("openai", &["--tokens", "4"]).await;
    let refuser = Mock::start("openai", &["--tokens", "4"]).await;
    let cheap = Mock::start("openai", &["--tokens", "4"]).await;
    off.set_fault(json!({"type": "off_schema"})).await;
    refuser
        .set_fault(json!({"type": "refusal", "after_tokens": 0}))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("golden.json");
    let config = format!(
        "[golden]\nrecord = \"{}\"\n{}{}{}{}{}ladder = [\"fallback\", \"downshift\", \"refuse\"]\ndownshift = [\"cheap/m\"]\nrequire_validated = true\nmax_attempts = 4\n",
        record.display(),
        provider("good", "openai", &good.base_url(), "m"),
        provider("off", "openai", &off.base_url(), "m"),
        provider("refuser", "openai", &refuser.base_url(), "m"),
        provider("cheap", "openai", &cheap.base_url(), "m"),
        route("support", &["good/m", "off/m", "refuser/m"]),
    );
    std::fs::write(dir.path().join("set.toml"), SET).unwrap();
    std::fs::write(dir.path().join("switchyard.toml"), &config).unwrap();
    Setup {
        good,
        off,
        refuser,
        cheap,
        dir,
        config,
    }
}

impl Setup {
    async fn golden(&self, extra: &[&str]) -> (i32, String) {
        let out = tokio::process::Command::new(BIN)
            .args(["golden", "--route", "support", "--set"])
            .arg(self.dir.path().join("set.toml"))
            .arg("--config")
            .arg(self.dir.path().join("switchyard.toml"))
            .args(extra)
            .output()
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    async fn clear_logs(&self) {
        for m in [&self.good, &self.off, &self.refuser, &self.cheap] {
            m.clear().await;
        }
    }

    async fn all_targets_fail(&self) {
        for m in [&self.good, &self.off, &self.refuser] {
            m.set_fault(json!({"type": "status", "status": 500})).await;
        }
    }
}

fn row<'a>(table: &'a str, target: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("| {target} |")))
        .unwrap_or_else(|| panic!("no row for {target} in\n{table}"))
}

#[tokio::test]
async fn golden_flags_the_schema_breaker_and_the_refuser_and_gates_the_downshift() {
    let s = setup().await;
    let sy = Switchyard::start(&s.config).await;
    let mut client = sy.client().await;

    // Nothing validated yet: the downshift target is not used.
    s.all_targets_fail().await;
    let got = stream(&mut client, request("support")).await;
    let status = got.status.expect("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        s.cheap.requests().await.is_empty(),
        "an unvalidated downshift target was used"
    );

    // The golden run, through the running Switchyard.
    s.good.set_fault(json!({})).await;
    s.off.set_fault(json!({"type": "off_schema"})).await;
    s.refuser
        .set_fault(json!({"type": "refusal", "after_tokens": 0}))
        .await;
    s.clear_logs().await;
    let (code, out) = s.golden(&["--target", &sy.grpc]).await;
    assert_eq!(code, 1, "some target is not validated:\n{out}");
    assert!(
        row(&out, "good/m").contains("| yes | 1/1 | 1/1 | 1/1 | 1.000 (lexical) |"),
        "{out}"
    );
    assert!(row(&out, "cheap/m").contains("| yes |"), "{out}");
    let off = row(&out, "off/m");
    assert!(off.contains("| NO | 0/1 | 1/1 | 1/1 |"), "{out}");
    assert!(
        row(&out, "refuser/m").starts_with("| refuser/m | NO |"),
        "{out}"
    );
    assert!(
        out.contains("off/m: status-json: structured output"),
        "{out}"
    );
    assert!(
        out.contains("refuser/m: greeting: refusal: expected an answer, the target refused"),
        "{out}"
    );
    assert!(
        out.contains("written to the server's [golden] record file"),
        "{out}"
    );
    // One pinned request per case and target: no retry, no failover.
    for m in [&s.good, &s.off, &s.refuser, &s.cheap] {
        let log = m.requests().await;
        assert_eq!(log.len(), 3, "{log:?}");
    }
    let log = s.good.requests().await;
    let json_cases: Vec<&Value> = log
        .iter()
        .map(|r| &r["body"])
        .filter(|b| b["response_format"]["type"] == "json_object")
        .collect();
    assert_eq!(json_cases.len(), 1, "JSON mode for the schema case only");
    assert!(log.iter().all(|r| r["body"]["temperature"] == 0.0));

    // Shown by /v1/status and ListProviders.
    let (_, body) = sy.admin_get("/v1/status").await;
    let status: Value = serde_json::from_str(&body).unwrap();
    let r = status["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "support")
        .unwrap();
    assert_eq!(r["require_validated"], true);
    let validated: Vec<(&str, bool)> = r["validation"]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["target"].as_str().unwrap(),
                t["validated"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        validated,
        [
            ("good/m", true),
            ("off/m", false),
            ("refuser/m", false),
            ("cheap/m", true)
        ]
    );
    let mut admin = proto::admin_client::AdminClient::connect(format!("http://{}", sy.grpc))
        .await
        .unwrap();
    let list = admin
        .list_providers(proto::ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner();
    let route = list.routes.iter().find(|r| r.name == "support").unwrap();
    assert!(route.require_validated);
    let cheap = route
        .validations
        .iter()
        .find(|v| v.target == "cheap/m")
        .unwrap();
    assert!(cheap.validated && cheap.validated_unix_ms > 0 && cheap.set_sha256.len() == 64);
    let off = route
        .validations
        .iter()
        .find(|v| v.target == "off/m")
        .unwrap();
    assert!(!off.validated && !off.failures.is_empty());

    // Validated now: the downshift rung serves from it.
    s.all_targets_fail().await;
    let got = stream(&mut client, request("support")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(f.tier, Tier::Downshift as i32);
    assert_eq!(f.served_by.unwrap().provider, "cheap");

    // The record outlives the server: a new one reads it from the file.
    drop(sy);
    let sy = Switchyard::start(&s.config).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("support")).await;
    assert_eq!(
        got.finished.map(|f| f.tier),
        Some(Tier::Downshift as i32),
        "{:?}",
        got.status
    );
}

#[tokio::test]
async fn golden_in_process_takes_jsonl_and_exits_0_when_every_target_passes() {
    let s = setup().await;
    s.off.set_fault(json!({})).await;
    s.refuser.set_fault(json!({})).await;
    let jsonl = s.dir.path().join("set.jsonl");
    std::fs::write(
        &jsonl,
        "{\"name\":\"a\",\"prompt\":\"Say hello.\",\"refusal\":false}\n{\"name\":\"b\",\"prompt\":\"JSON please\",\"schema\":{\"type\":\"object\",\"required\":[\"answer\"]}}\n",
    )
    .unwrap();
    let local = s.dir.path().join("local.json");
    let out = tokio::process::Command::new(BIN)
        .args(["golden", "--route", "support", "--json", "--set"])
        .arg(&jsonl)
        .arg("--config")
        .arg(s.dir.path().join("switchyard.toml"))
        .arg("--record")
        .arg(&local)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("(in process)"), "{stderr}");
    let printed: Value = serde_json::from_str(&stdout).expect("--json prints the record alone");
    assert_eq!(printed["route"], "support");
    // Both the in-process server's [golden] record and --record hold it.
    for file in [s.dir.path().join("golden.json"), local] {
        let all: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let targets = all["routes"]["support"]["targets"].as_array().unwrap();
        assert_eq!(targets.len(), 4, "{all}");
        assert!(targets.iter().all(|t| t["validated"] == true), "{all}");
        assert_eq!(
            all["routes"]["support"]["set"].as_str().unwrap(),
            jsonl.display().to_string()
        );
    }
    // Could not run: exit 2 with the reason.
    let (code, out) = s.golden(&["--route", "nope"]).await;
    assert_eq!(code, 2, "{out}");
}
