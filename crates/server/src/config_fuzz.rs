//! Property-based fuzzing of `Config::from_toml_str` on arbitrary text and on
//! a full valid config with lines deleted, duplicated, moved or given other
//! values: never a panic; an `Err` names a dotted path, or the file is not
//! TOML at all. Cases follow `PROPTEST_CASES` (long mode: `--release`).

#![allow(clippy::unwrap_used)]

use proptest::collection::vec;
use proptest::prelude::*;

use crate::config::Config;

/// Every section, with values that differ from the defaults where they can.
const SEED: &str = r#"
[server]
grpc_listen = "127.0.0.1:50051"
admin_listen = "127.0.0.1:9464"
http_listen = "127.0.0.1:8080"
log_format = "json"
default_deadline = "120s"
stream_buffer = 64
drain_timeout = "20s"
watch_config = true

[auth]
mode = "open"

[limits]
max_request_bytes = 4194304
max_messages = 512
max_prompt_bytes = 2097152
max_tools = 128
max_tokens = 128000
tenant_max_concurrent = 4
tenant_rate_per_sec = 2.5
tenant_burst = 5

[retry_budget]
ratio = 0.1
min_per_sec = 1.0
ttl = "10s"

[backoff]
base = "100ms"
cap = "5s"
retry_after_jitter = 0.1

[idempotency]
ttl = "24h"
max_entries = 100000

[cache]
max_bytes = 67108864

[state]
backend = "embedded"
key_prefix = "switchyard:"
timeout = "250ms"

[cost]
window = "1h"
default_cap_usd = 50.0
tenant_caps_usd = { "team-search" = 200.0 }

[[providers]]
id = "primary"
kind = "openai"
base_url = "http://127.0.0.1:8001/v1"
api_key_env = "PRIMARY_API_KEY"
max_concurrency = 64
failover_max_concurrency = 16
connect_timeout = "5s"
first_token_timeout = "30s"
idle_timeout = "30s"
auth_cooldown = "300s"
breaker = { consecutive_failures = 5, failure_rate = 0.5, window = "30s", min_calls = 20, open_for = "30s", max_open_for = "300s", jitter = 0.1, half_open_probes = 1, probe_timeout = "30s" }
health = { window = "60s", buckets = 12, prior_successes = 5, latency_target = "30s", min_calls = 20 }
cooldown = { rate_limit_cooldown = "1s", quota_cooldown = "300s" }

  [[providers.models]]
  name = "gpt-4o-mini"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 8192
  price = { input_per_mtok = 0.15, output_per_mtok = 0.6 }

[[providers]]
id = "secondary"
kind = "anthropic"
base_url = "http://127.0.0.1:8002/v1"

  [[providers.models]]
  name = "claude-sonnet-4-5"

[[routes]]
name = "chat"
targets = ["primary/gpt-4o-mini", { target = "secondary/claude-sonnet-4-5", priority = 1, weight = 1 }]
max_attempts = 3
mid_stream = "fail"
side_effects = false
ladder = ["fallback", "downshift", "cache", "refuse"]
downshift = ["secondary/claude-sonnet-4-5"]
cache_ttl = "1h"
serve_fresh_within = "30s"
default_max_tokens = 1024
max_tokens_limit = 4096
deadline = "60s"
"#;

/// Values that are wrong in every way a hand-edited file can be wrong.
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "nan",
    "-inf",
    "-0.0",
    "0.5",
    "true",
    "\"\"",
    "\"0s\"",
    "\"1ns\"",
    "\"-5s\"",
    "\"18446744073709551615s\"",
    "\"999999999999999h\"",
    "\"soon\"",
    "\"primary/gpt-4o-mini\"",
    "\"nobody/none\"",
    "\"127.0.0.1:0\"",
    "\"{x}\"",
    "[]",
    "[\"\"]",
    "{}",
    "{ a = 1 }",
    "1979-05-27T07:32:00Z",
    "'''multi\nline'''",
];

/// One edit to the lines of a config.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Duplicate(usize),
    /// Moves a line elsewhere (into another section).
    Move(usize, usize),
    /// Replaces what follows `=` on a line.
    Value(usize, String),
    /// Replaces the key of a line.
    Key(usize, String),
    Insert(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let value = prop_oneof![
        4 => proptest::sample::select(VALUES).prop_map(str::to_owned),
        1 => any::<String>(),
    ];
    let key = prop_oneof![
        2 => proptest::sample::select(vec!["id", "name", "kind", "targets", "ladder", "mode", "\".\"", "[", "x y"]).prop_map(str::to_owned),
        1 => "[a-z_]{1,12}",
    ];
    let line = prop_oneof![
        proptest::sample::select(vec![
            "[[routes]]",
            "[[providers]]",
            "[[providers.models]]",
            "[server]",
            "[server.tls]",
            "[queue]",
            "[",
            "]]",
            "=",
            "#"
        ])
        .prop_map(str::to_owned),
        any::<String>(),
    ];
    let at = any::<usize>();
    prop_oneof![
        2 => at.prop_map(Edit::Delete),
        1 => at.prop_map(Edit::Duplicate),
        1 => (at, any::<usize>()).prop_map(|(a, b)| Edit::Move(a, b)),
        4 => (at, value).prop_map(|(a, v)| Edit::Value(a, v)),
        1 => (at, key).prop_map(|(a, k)| Edit::Key(a, k)),
        1 => (at, line).prop_map(|(a, l)| Edit::Insert(a, l)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for e in edits {
        let n = lines.len().max(1);
        match e {
            Edit::Delete(a) if !lines.is_empty() => {
                lines.remove(a % n);
            }
            Edit::Duplicate(a) if !lines.is_empty() => {
                let l = lines[a % n].clone();
                lines.insert(a % n, l);
            }
            Edit::Move(a, b) if !lines.is_empty() => {
                let l = lines.remove(a % n);
                lines.insert(b % lines.len().max(1), l);
            }
            Edit::Value(a, v) if !lines.is_empty() => {
                let l = &mut lines[a % n];
                if let Some((key, _)) = l.split_once('=') {
                    *l = format!("{key}= {v}");
                }
            }
            Edit::Key(a, k) if !lines.is_empty() => {
                let l = &mut lines[a % n];
                if let Some((_, value)) = l.split_once('=') {
                    *l = format!("{k} ={value}");
                }
            }
            Edit::Insert(a, l) => lines.insert(a % (lines.len() + 1), l.clone()),
            _ => {}
        }
    }
    lines.join("\n")
}

/// `Ok`, or an error with a path, empty only when the text is not TOML.
fn check(text: &str) -> Result<(), TestCaseError> {
    let Err(e) = Config::from_toml_str(text) else {
        return Ok(());
    };
    if e.path.is_empty() {
        prop_assert!(
            text.parse::<toml::Table>().is_err(),
            "valid TOML refused without a path: {}",
            e.message
        );
    }
    Ok(())
}

#[test]
fn fuzz_config_seed_is_valid() {
    assert!(Config::from_toml_str(SEED).is_ok());
}

#[test]
fn fuzz_config_odd_top_level_keys_keep_a_path() {
    let e = Config::from_toml_str(&format!("\".\" = 1\n{SEED}")).unwrap_err();
    assert_eq!(e.path, ".", "{e}");
    let e = Config::from_toml_str("['']").unwrap_err();
    assert_eq!(e.path, "\"\"", "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { ..ProptestConfig::default() })]

    #[test]
    fn fuzz_config_mutated_lines(edits in vec(edit(), 1..5)) {
        check(&apply(SEED, &edits))?;
    }

    #[test]
    fn fuzz_config_any_text(
        text in prop_oneof![
            any::<String>(),
            vec(proptest::sample::select(vec!["[", "]", "[[", "]]", "=", "\"", "'", "\n", "providers", "routes", ".", "{", "}", ",", "1", "x"]), 0..40)
                .prop_map(|t| t.concat()),
        ],
    ) {
        check(&text)?;
    }

    /// A valid config cut anywhere.
    #[test]
    fn fuzz_config_truncated(at in 0..SEED.len()) {
        check(&SEED[..at])?;
    }
}
