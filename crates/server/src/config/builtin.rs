//! The configuration `serve` uses without `--config`: real providers for
//! the keys in the environment, built-in mocks for the others.
use super::*;

impl Config {
    /// The built-in configuration used by `serve` without `--config`: real
    /// providers for whichever of `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` is set,
    /// the given mock base URLs for the others, and one route `chat` spanning both.
    pub fn builtin(openai_mock: Option<&str>, anthropic_mock: Option<&str>) -> Config {
        let openai_url = openai_mock.unwrap_or("https://api.openai.com/v1");
        let anthropic_url = anthropic_mock.unwrap_or("https://api.anthropic.com/v1");
        let all = vec![
            Capability::Chat,
            Capability::Stream,
            Capability::Tools,
            Capability::Json,
            Capability::Vision,
        ];
        let providers = vec![
            ProviderConfig {
                id: "openai".into(),
                kind: ProviderKind::Openai,
                base_url: openai_url.into(),
                keys: None,
                api_version: None,
                region: None,
                project: None,
                credentials_file_env: None,
                api_key_env: openai_mock.is_none().then(|| "OPENAI_API_KEY".into()),
                max_concurrency: default_max_concurrency(),
                failover_max_concurrency: default_failover_max_concurrency(),
                connect_timeout: default_connect_timeout(),
                first_token_timeout: default_first_token_timeout(),
                idle_timeout: default_idle_timeout(),
                breaker: BreakerConfig::default(),
                health: HealthConfig::default(),
                cooldown: CooldownConfig::default(),
                auth_cooldown: default_auth_cooldown(),
                synthetic_probes: false,
                // The built-in mocks serve h2c, as the real hosts serve HTTP/2 over TLS.
                http2_prior_knowledge: openai_mock.is_some(),
                stream_unary: default_stream_unary(),
                rpm: None,
                tpm: None,
                models: vec![
                    ModelConfig {
                        name: "gpt-4o-mini".into(),
                        capabilities: all.clone(),
                        context_tokens: 128_000,
                        price: Price {
                            input_per_mtok: 0.15,
                            output_per_mtok: 0.6,
                            ..Price::default()
                        },
                        family: None,
                    },
                    ModelConfig {
                        name: "text-embedding-3-small".into(),
                        capabilities: vec![Capability::Embeddings],
                        context_tokens: 8191,
                        price: Price {
                            input_per_mtok: 0.02,
                            ..Price::default()
                        },
                        family: None,
                    },
                ],
            },
            ProviderConfig {
                id: "anthropic".into(),
                kind: ProviderKind::Anthropic,
                base_url: anthropic_url.into(),
                keys: None,
                api_version: None,
                region: None,
                project: None,
                credentials_file_env: None,
                api_key_env: anthropic_mock.is_none().then(|| "ANTHROPIC_API_KEY".into()),
                max_concurrency: default_max_concurrency(),
                failover_max_concurrency: default_failover_max_concurrency(),
                connect_timeout: default_connect_timeout(),
                first_token_timeout: default_first_token_timeout(),
                idle_timeout: default_idle_timeout(),
                breaker: BreakerConfig::default(),
                health: HealthConfig::default(),
                cooldown: CooldownConfig::default(),
                auth_cooldown: default_auth_cooldown(),
                synthetic_probes: false,
                http2_prior_knowledge: anthropic_mock.is_some(),
                stream_unary: default_stream_unary(),
                rpm: None,
                tpm: None,
                models: vec![ModelConfig {
                    name: "claude-sonnet-4-5".into(),
                    capabilities: vec![
                        Capability::Chat,
                        Capability::Stream,
                        Capability::Tools,
                        Capability::Vision,
                    ],
                    context_tokens: 200_000,
                    price: Price {
                        input_per_mtok: 3.0,
                        output_per_mtok: 15.0,
                        cache_read_per_mtok: None,
                        cache_write_5m_per_mtok: None,
                        cache_write_1h_per_mtok: None,
                    },
                    family: None,
                }],
            },
        ];
        Config {
            server: ServerConfig::default(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            retry_budget: RetryBudgetConfig::default(),
            backoff: Backoff::default(),
            idempotency: IdempotencyConfig::default(),
            admin: AdminConfig::default(),
            cache: CacheConfig::default(),
            cost: CostConfig::default(),
            queue: None,
            state: StateConfig::default(),
            golden: None,
            responses: ResponsesConfig::default(),
            resume: ResumeConfig::default(),
            providers,
            routes: vec![
                builtin_route(
                    "chat",
                    &["openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5"],
                ),
                builtin_route("embed", &["openai/text-embedding-3-small"]),
            ],
        }
    }
}

/// A built-in route: its targets in order, every option at its default.
fn builtin_route(name: &str, targets: &[&str]) -> RouteConfig {
    RouteConfig {
        name: name.into(),
        targets: targets.iter().map(|&t| t.into()).collect(),
        max_attempts: default_max_attempts(),
        mid_stream: MidStreamPolicy::Fail,
        on_caller_gone: None,
        side_effects: false,
        default_max_tokens: None,
        service_tier: None,
        deadline: None,
        ladder: default_ladder(),
        downshift: Vec::new(),
        cache_ttl: default_cache_ttl(),
        serve_fresh_within: None,
        max_tokens_limit: None,
        semantic_cache: None,
        require_validated: false,
        shared_across_tenants: false,
        fail_closed: false,
        embedding_family_failover: FamilyFailover::Same,
        cache_affinity: None,
        admission_wait: Duration::ZERO,
        priority: TrafficPriority::Interactive,
        batch_share: default_batch_share(),
        hedge: None,
    }
}
