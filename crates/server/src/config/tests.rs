//! Config parsing and validation tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

const GOOD: &str = r#"
[server]
grpc_listen = "127.0.0.1:50051"
admin_listen = "127.0.0.1:9464"

[[providers]]
id = "primary"
kind = "openai"
base_url = "http://127.0.0.1:8001/v1"
api_key_env = "PRIMARY_API_KEY"
max_concurrency = 64
failover_max_concurrency = 16

  [[providers.models]]
  name = "gpt-4o-mini"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000

[[providers]]
id = "secondary"
kind = "anthropic"
base_url = "http://127.0.0.1:8002/v1"

  [[providers.models]]
  name = "claude-sonnet-4-5"

[[routes]]
name = "chat"
targets = ["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
"#;

#[test]
fn the_issue_example_parses() {
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.providers.len(), 2);
    assert_eq!(c.providers[1].max_concurrency, 64);
    assert_eq!(
        c.providers[1].models[0].capabilities,
        vec![Capability::Chat, Capability::Stream]
    );
    assert_eq!(
        c.resolve_target("secondary/claude-sonnet-4-5").unwrap(),
        TargetRef {
            provider: 1,
            model: 0
        }
    );
}

fn err(text: &str) -> ConfigError {
    Config::from_toml_str(text).unwrap_err()
}

#[test]
fn embeddings_models_and_their_family() {
    let with = |model: &str, route: &str| {
        GOOD.replace(
            "  name = \"gpt-4o-mini\"\n",
            &format!("  name = \"gpt-4o-mini\"\n{model}\n"),
        )
        .replace(
            "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]",
            &format!("targets = [\"primary/gpt-4o-mini\"]\n{route}"),
        )
    };
    let c = Config::from_toml_str(&with(
        "  family = \"te3\"",
        "embedding_family_failover = \"any\"",
    ))
    .unwrap();
    assert_eq!(c.providers[0].models[0].family(), "te3");
    assert_eq!(c.providers[1].models[0].family(), "claude-sonnet-4-5");
    assert_eq!(c.routes[0].embedding_family_failover, FamilyFailover::Any);
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.routes[0].embedding_family_failover, FamilyFailover::Same);
    let e = err(&with("  family = \"\"", ""));
    assert_eq!(e.path, "providers[0].models[0].family");
    let e = err(&with("", "embedding_family_failover = \"some\""));
    assert_eq!(e.path, "routes[0].embedding_family_failover");
    // Embeddings come from an OpenAI-compatible /embeddings only.
    let e = err(&GOOD.replace(
        "  name = \"claude-sonnet-4-5\"",
        "  name = \"claude-sonnet-4-5\"\n  capabilities = [\"embeddings\"]",
    ));
    assert_eq!(e.path, "providers[1].models[0].capabilities");
    assert!(e.message.contains("`anthropic`"), "{e}");
}

/// The worked examples of docs/prices.md ("Prices and prompt caching"), to the cent.
#[test]
fn readme_worked_prices() {
    use crate::chat::{Dialect, Usage};
    let price = |input, output, read| Price {
        input_per_mtok: input,
        output_per_mtok: output,
        cache_read_per_mtok: read,
        ..Price::default()
    };
    let usage = |input, read, write, write_1h, output, reasoning| Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_input_tokens: read,
        cache_write_input_tokens: write,
        cache_write_1h_input_tokens: write_1h,
        reasoning_tokens: reasoning,
    };
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
    // OpenAI: prompt 10,000 with 8,192 cached, 500 out.
    let openai = usage(1808, 8192, 0, 0, 500, 0);
    close(
        price(2.5, 10.0, None).usage_cost(&openai, Dialect::Openai),
        0.01976,
    );
    close(
        price(2.0, 8.0, Some(0.5)).usage_cost(&openai, Dialect::Openai),
        0.011712,
    );
    // Anthropic: a 6,000-token marked prefix written (5m, 1h), then read.
    let sonnet = price(3.0, 15.0, None);
    let cost = |u: &Usage| sonnet.usage_cost(u, Dialect::Anthropic);
    close(cost(&usage(50, 0, 6000, 0, 400, 0)), 0.02865);
    close(cost(&usage(50, 0, 6000, 6000, 400, 0)), 0.04215);
    close(cost(&usage(80, 6000, 0, 0, 400, 0)), 0.00804);
    close(cost(&usage(6080, 0, 0, 0, 400, 0)), 0.02424);
    // Gemini: prompt 10,000 with 8,000 cached, 300 out and 700 thoughts.
    close(
        price(0.3, 2.5, None).usage_cost(&usage(2000, 8000, 0, 0, 1000, 700), Dialect::Gemini),
        0.0037,
    );
}

#[test]
fn prices_are_finite_and_non_negative_and_errors_name_the_field() {
    let priced = |price: &str| {
        GOOD.replace(
            "  name = \"claude-sonnet-4-5\"\n",
            &format!("  name = \"claude-sonnet-4-5\"\n  price = {{ {price} }}\n"),
        )
    };
    let c = Config::from_toml_str(&priced(
        "input_per_mtok = 3.0, output_per_mtok = 15.0, cache_read = 0.3, cache_write_1h = 6.0",
    ))
    .unwrap();
    let p = c.providers[1].models[0].price;
    assert_eq!(
        (p.cache_read_per_mtok, p.cache_write_1h_per_mtok),
        (Some(0.3), Some(6.0))
    );
    for (price, field) in [
        ("input_per_mtok = -1.0", "input_per_mtok"),
        ("output_per_mtok = inf", "output_per_mtok"),
        ("cache_read_per_mtok = nan", "cache_read_per_mtok"),
        ("cache_write_5m = -0.5", "cache_write_5m_per_mtok"),
        ("cache_write_1h_per_mtok = -inf", "cache_write_1h_per_mtok"),
    ] {
        let e = err(&priced(price));
        assert_eq!(
            e.path,
            format!("providers[1].models[0].price.{field}"),
            "{e}"
        );
        assert!(e.message.contains("finite, non-negative"), "{e}");
    }
}

#[test]
fn cache_affinity_takes_a_ttl_within_a_day() {
    let route = "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]";
    let with = |extra: &str| GOOD.replace(route, &format!("{route}\n{extra}"));
    let c = Config::from_toml_str(&with("cache_affinity = { ttl = \"5m\" }")).unwrap();
    assert_eq!(
        c.routes[0].cache_affinity,
        Some(CacheAffinityConfig {
            ttl: Duration::from_secs(300)
        })
    );
    assert_eq!(
        Config::from_toml_str(GOOD).unwrap().routes[0].cache_affinity,
        None
    );
    for bad in ["\"0s\"", "\"25h\""] {
        let e = err(&with(&format!("cache_affinity = {{ ttl = {bad} }}")));
        assert_eq!(e.path, "routes[0].cache_affinity.ttl", "{e}");
    }
    let e = err(&with("cache_affinity = { ttl = \"5m\", sticky = true }"));
    assert!(e.path.starts_with("routes[0].cache_affinity"), "{e}");
}

#[test]
fn unknown_field_names_its_path() {
    let e = err(&GOOD.replace(
        "max_concurrency = 64",
        "max_concurrency = 64\nmax_concurency = 3",
    ));
    assert_eq!(e.path, "providers[0].max_concurency");
    assert!(e.message.contains("max_concurency"), "{e}");
}

#[test]
fn bad_kind_names_its_path_and_value() {
    let e = err(&GOOD.replace("kind = \"anthropic\"", "kind = \"antropic\""));
    assert_eq!(e.path, "providers[1].kind");
    assert!(e.message.contains("antropic"), "{e}");
}

#[test]
fn bad_duration_names_its_path() {
    let e = err(&GOOD.replace(
        "max_concurrency = 64\nfailover",
        "idle_timeout = \"soon\"\nmax_concurrency = 64\nfailover",
    ));
    assert_eq!(e.path, "providers[0].idle_timeout");
}

#[test]
fn a_duration_of_centuries_is_refused_with_its_path_not_a_panic_per_request() {
    let route = "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]";
    for (key, at, path) in [
        ("cache_ttl", route, "routes[0].cache_ttl"),
        ("deadline", route, "routes[0].deadline"),
        (
            "breaker.open_for",
            "failover_max_concurrency = 16",
            "providers[0].breaker.open_for",
        ),
        (
            "body_read_timeout",
            "admin_listen = \"127.0.0.1:9464\"",
            "server.body_read_timeout",
        ),
        ("ttl", "[idempotency]", "idempotency.ttl"),
    ] {
        let text = if at == "[idempotency]" {
            format!("{GOOD}\n[idempotency]\nttl = \"500000000000y\"\n")
        } else {
            GOOD.replace(at, &format!("{at}\n{key} = \"500000000000y\""))
        };
        let e = err(&text);
        assert_eq!(e.path, path, "{e}");
        assert!(e.message.contains("longer than 10 years"), "{e}");
    }
    // Ten years is still a setting.
    let c = Config::from_toml_str(&GOOD.replace(route, &format!("{route}\ncache_ttl = \"3650d\"")))
        .unwrap();
    assert_eq!(c.routes[0].cache_ttl, duration::LONGEST);
}

#[test]
fn unknown_target_names_route_and_index() {
    let e = err(&GOOD.replace("secondary/claude-sonnet-4-5\"]", "secondary/claude-3\"]"));
    assert_eq!(e.path, "routes[0].targets[1]");
    assert!(e.message.contains("claude-3"), "{e}");
}

#[test]
fn targets_take_a_string_or_a_table() {
    let c = Config::from_toml_str(&GOOD.replace(
        "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]",
        "targets = [\"primary/gpt-4o-mini\", { target = \"secondary/claude-sonnet-4-5\", priority = 0, weight = 3 }]\nmid_stream = \"reset\"",
    ))
    .unwrap();
    let r = &c.routes[0];
    assert_eq!(r.targets[1].weight, 3);
    assert_eq!(r.targets[1].priority, Some(0));
    assert_eq!(r.mid_stream, MidStreamPolicy::Reset);
    assert_eq!(r.max_attempts, 3);
    let e = err(&GOOD.replace(
        "\"secondary/claude-sonnet-4-5\"]",
        "{ target = \"secondary/claude-sonnet-4-5\", wieght = 3 }]",
    ));
    assert_eq!(e.path, "routes[0].targets[1]");
}

#[test]
fn failover_ceiling_above_total_is_rejected() {
    let e = err(&GOOD.replace(
        "failover_max_concurrency = 16",
        "failover_max_concurrency = 100",
    ));
    assert_eq!(e.path, "providers[0].failover_max_concurrency");
}

#[test]
fn duplicate_provider_is_rejected() {
    let e = err(&GOOD.replace("id = \"secondary\"", "id = \"primary\""));
    assert_eq!(e.path, "providers[1].id");
}

#[test]
fn semantic_cache_settings_are_checked_with_their_paths() {
    let with = |settings: &str, ladder: &str| {
        GOOD.replace(
            "  name = \"gpt-4o-mini\"",
            "  name = \"emb\"\n  capabilities = [\"embeddings\"]\n  [[providers.models]]\n  name = \"gpt-4o-mini\"",
        ) + &format!("ladder = {ladder}\nsemantic_cache = {{ {settings} }}\n")
    };
    let rung = "[\"fallback\", \"semantic_cache\", \"refuse\"]";
    let c = Config::from_toml_str(&with("embedder = \"primary/emb\"", rung)).unwrap();
    let s = c.routes[0].semantic_cache.as_ref().unwrap();
    assert_eq!(s.threshold, 0.92);
    assert_eq!(s.max_entries, 100_000);
    assert_eq!(s.ttl, Duration::from_secs(3600));
    assert!(c.routes[0].has_rung(Rung::SemanticCache));
    for (settings, ladder, path, says) in [
        (
            "embedder = \"primary/gpt-4o-mini\"",
            rung,
            "embedder",
            "embeddings",
        ),
        (
            "embedder = \"secondary/claude-sonnet-4-5\"",
            rung,
            "embedder",
            "embeddings",
        ),
        ("embedder = \"primary/nope\"", rung, "embedder", "no model"),
        (
            "embedder = \"primary/emb\", threshold = 1.5",
            rung,
            "threshold",
            "(0, 1]",
        ),
        (
            "embedder = \"primary/emb\", max_entries = 0",
            rung,
            "max_entries",
            "outside",
        ),
        (
            "embedder = \"primary/emb\", ttl = \"0s\"",
            rung,
            "ttl",
            "positive",
        ),
        (
            "embedder = \"primary/emb\", fresh_within = \"2h\"",
            rung,
            "fresh_within",
            "ttl",
        ),
        (
            "embedder = \"primary/emb\", lookup_timeout = \"1m\"",
            rung,
            "lookup_timeout",
            "10s",
        ),
        (
            "embedder = \"primary/emb\", threshhold = 0.9",
            rung,
            "threshhold",
            "unknown",
        ),
        (
            "embedder = \"primary/emb\"",
            "[\"fallback\", \"refuse\"]",
            "",
            "never read",
        ),
    ] {
        let e = err(&with(settings, ladder));
        let want = if path.is_empty() {
            "routes[0].semantic_cache".to_string()
        } else {
            format!("routes[0].semantic_cache.{path}")
        };
        assert_eq!(e.path, want, "{settings}: {e}");
        assert!(e.message.contains(says), "{settings}: {e}");
    }
    let e = err(&GOOD.replace(
        "targets = [",
        "ladder = [\"fallback\", \"semantic_cache\"]\ntargets = [",
    ));
    assert_eq!(e.path, "routes[0].ladder");
    assert!(e.message.contains("semantic_cache"), "{e}");
}

#[test]
fn builtin_config_is_valid_and_spans_both_kinds() {
    let c = Config::builtin(Some("http://127.0.0.1:1/v1"), Some("http://127.0.0.1:2/v1"));
    c.validate().unwrap();
    assert_eq!(c.routes[0].name, "chat");
    assert!(c.providers.iter().all(|p| p.api_key_env.is_none()));
    assert!(
        c.providers.iter().all(|p| p.http2_prior_knowledge),
        "mocks speak h2c"
    );
    let real = Config::builtin(None, None);
    real.validate().unwrap();
    assert!(
        real.providers.iter().all(|p| !p.http2_prior_knowledge),
        "https: ALPN"
    );
    assert_eq!(
        real.providers[0].api_key_env.as_deref(),
        Some("OPENAI_API_KEY")
    );
}

#[test]
fn stream_unary_is_on_by_default_and_only_openai_shaped_kinds_turn_it_off() {
    let c = Config::from_toml_str(GOOD).unwrap();
    assert!(c.providers.iter().all(|p| p.stream_unary), "on by default");
    let off = "failover_max_concurrency = 16\nstream_unary = false";
    let c = Config::from_toml_str(&GOOD.replacen("failover_max_concurrency = 16", off, 1)).unwrap();
    assert!(!c.providers[0].stream_unary);
    assert!(c.providers[1].stream_unary);
    let anthropic = GOOD
        .replacen("failover_max_concurrency = 16", off, 1)
        .replacen("kind = \"openai\"", "kind = \"anthropic\"", 1);
    let e = err(&anthropic);
    assert_eq!(e.path, "providers[0].stream_unary");
    assert!(e.message.contains("always called streaming"), "{e:?}");
}

#[test]
fn http2_prior_knowledge_is_for_plain_http_upstreams() {
    let on = "failover_max_concurrency = 16\nhttp2_prior_knowledge = true";
    let c = Config::from_toml_str(&GOOD.replace("failover_max_concurrency = 16", on)).unwrap();
    assert!(c.providers[0].http2_prior_knowledge);
    assert!(!c.providers[1].http2_prior_knowledge, "off by default");
    let e = err(&GOOD.replace("failover_max_concurrency = 16", on).replacen(
        "http://127.0.0.1:8001/v1",
        "https://api.openai.com/v1",
        1,
    ));
    assert_eq!(e.path, "providers[0].http2_prior_knowledge");
    assert!(e.message.contains("ALPN"), "{e:?}");
}

#[test]
fn worker_threads_is_absent_by_default_and_bounded() {
    let c = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(c.server.worker_threads, None, "one per core by default");
    let with = |n: &str| GOOD.replace("[server]\n", &format!("[server]\nworker_threads = {n}\n"));
    let c = Config::from_toml_str(&with("3")).unwrap();
    assert_eq!(c.server.worker_threads, Some(3));
    for bad in ["0", "1025"] {
        let e = err(&with(bad));
        assert_eq!(e.path, "server.worker_threads", "{bad}");
        assert!(e.message.contains("1 to 1024"), "{e:?}");
    }
    let e = err(&with("-1"));
    assert_eq!(e.path, "server.worker_threads");
}
