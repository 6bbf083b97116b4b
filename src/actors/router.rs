//! The router actor: owns the route table and turns a request's route and
//! needs into an ordered plan of candidate targets, failing closed on
//! capabilities. It decides; it never touches a response byte.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::config::{Capability, Config};

/// What a request needs from a target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub tools: bool,
    pub json: bool,
    pub vision: bool,
    pub min_context_tokens: u32,
}

/// One target the request may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub provider: String,
    pub model: String,
    /// The route's first target: its traffic is the provider's own.
    pub primary: bool,
    /// Position in the route's fallback order.
    pub position: usize,
    /// The model declares streaming.
    pub streams: bool,
}

/// The ordered candidates for one request and the route's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub route: String,
    pub candidates: Vec<Candidate>,
    pub default_max_tokens: Option<u32>,
    pub deadline: Option<Duration>,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown route `{0}`")]
    UnknownRoute(String),
    #[error("no target of route `{route}` has {}", missing.join(", "))]
    NoCapableTarget { route: String, missing: Vec<String> },
}

pub enum RouterMsg {
    Plan {
        route: String,
        needs: Needs,
        reply: RpcReplyPort<Result<Plan, PlanError>>,
    },
}

struct RouteEntry {
    targets: Vec<TargetInfo>,
    default_max_tokens: Option<u32>,
    deadline: Option<Duration>,
}

struct TargetInfo {
    provider: String,
    model: String,
    capabilities: Vec<Capability>,
    context_tokens: u32,
}

impl TargetInfo {
    /// The needs this target does not meet, by name.
    fn unmet(&self, needs: &Needs) -> Vec<String> {
        let mut missing = Vec::new();
        for (needed, cap) in [
            (needs.tools, Capability::Tools),
            (needs.json, Capability::Json),
            (needs.vision, Capability::Vision),
        ] {
            if needed && !self.capabilities.contains(&cap) {
                missing.push(cap.as_str().to_string());
            }
        }
        if self.context_tokens < needs.min_context_tokens {
            missing.push(format!("context_tokens >= {}", needs.min_context_tokens));
        }
        missing
    }
}

/// The actor; the config arrives as the argument.
pub struct RouterActor;

/// Mutable state: the route table built from the current config.
pub struct RouterState {
    /// Routes by name.
    routes: HashMap<String, RouteEntry>,
}

fn build_routes(config: &Config) -> HashMap<String, RouteEntry> {
    config
        .routes
        .iter()
        .map(|r| {
            let targets = r
                .targets
                .iter()
                .filter_map(|t| config.resolve_target(&t.target).ok())
                .map(|t| {
                    let p = &config.providers[t.provider];
                    let m = &p.models[t.model];
                    TargetInfo {
                        provider: p.id.clone(),
                        model: m.name.clone(),
                        capabilities: m.capabilities.clone(),
                        context_tokens: m.context_tokens,
                    }
                })
                .collect();
            let entry = RouteEntry {
                targets,
                default_max_tokens: r.default_max_tokens,
                deadline: r.deadline,
            };
            (r.name.clone(), entry)
        })
        .collect()
}

fn plan(
    routes: &HashMap<String, RouteEntry>,
    route: &str,
    needs: &Needs,
) -> Result<Plan, PlanError> {
    let entry = routes
        .get(route)
        .ok_or_else(|| PlanError::UnknownRoute(route.to_string()))?;
    let candidates: Vec<Candidate> = entry
        .targets
        .iter()
        .enumerate()
        .filter(|(_, t)| t.unmet(needs).is_empty())
        .map(|(position, t)| Candidate {
            provider: t.provider.clone(),
            model: t.model.clone(),
            primary: position == 0,
            position,
            streams: t.capabilities.contains(&Capability::Stream),
        })
        .collect();
    if candidates.is_empty() {
        // Name what no target offers; if every need exists somewhere but never
        // together, name them all.
        let mut missing: Vec<String> = Vec::new();
        for t in &entry.targets {
            for m in t.unmet(needs) {
                if !missing.contains(&m) {
                    missing.push(m);
                }
            }
        }
        return Err(PlanError::NoCapableTarget {
            route: route.to_string(),
            missing,
        });
    }
    Ok(Plan {
        route: route.to_string(),
        candidates,
        default_max_tokens: entry.default_max_tokens,
        deadline: entry.deadline,
    })
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = Arc<Config>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        config: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(RouterState {
            routes: build_routes(&config),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RouterMsg::Plan {
                route,
                needs,
                reply,
            } => {
                let _ = reply.send(plan(&state.routes, &route, &needs));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::from_toml_str(
            r#"
[[providers]]
id = "a"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
  [[providers.models]]
  name = "small"
  capabilities = ["chat", "stream"]
  context_tokens = 8000
  [[providers.models]]
  name = "big"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000
[[providers]]
id = "b"
kind = "anthropic"
base_url = "http://127.0.0.1:2/v1"
  [[providers.models]]
  name = "claude"
  capabilities = ["chat", "stream", "tools", "vision"]
  context_tokens = 200000
[[routes]]
name = "chat"
targets = ["a/small", "a/big", "b/claude"]
"#,
        )
        .unwrap()
    }

    #[test]
    fn plan_keeps_route_order_and_marks_primary() {
        let routes = build_routes(&config());
        let p = plan(&routes, "chat", &Needs::default()).unwrap();
        let names: Vec<_> = p
            .candidates
            .iter()
            .map(|c| format!("{}/{}", c.provider, c.model))
            .collect();
        assert_eq!(names, ["a/small", "a/big", "b/claude"]);
        assert_eq!(p.candidates.iter().filter(|c| c.primary).count(), 1);
        assert!(p.candidates[0].primary);
    }

    #[test]
    fn tools_never_land_on_a_model_without_them() {
        let routes = build_routes(&config());
        let needs = Needs {
            tools: true,
            ..Needs::default()
        };
        let p = plan(&routes, "chat", &needs).unwrap();
        let names: Vec<_> = p.candidates.iter().map(|c| c.model.as_str()).collect();
        assert_eq!(names, ["big", "claude"]);
        assert!(
            !p.candidates[0].primary,
            "the primary was filtered out; the rest is failover traffic"
        );
    }

    #[test]
    fn context_and_vision_filter() {
        let routes = build_routes(&config());
        let needs = Needs {
            vision: true,
            min_context_tokens: 150_000,
            ..Needs::default()
        };
        let p = plan(&routes, "chat", &needs).unwrap();
        assert_eq!(p.candidates.len(), 1);
        assert_eq!(p.candidates[0].model, "claude");
    }

    #[test]
    fn nothing_capable_fails_closed_naming_what_is_missing() {
        let routes = build_routes(&config());
        let needs = Needs {
            json: true,
            vision: true,
            ..Needs::default()
        };
        let err = plan(&routes, "chat", &needs).unwrap_err();
        match err {
            PlanError::NoCapableTarget { missing, .. } => {
                assert!(missing.contains(&"json".to_string()));
                assert!(missing.contains(&"vision".to_string()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            plan(&routes, "nope", &Needs::default()).unwrap_err(),
            PlanError::UnknownRoute("nope".into())
        );
    }
}
