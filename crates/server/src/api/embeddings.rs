//! `Router.Embed`'s contract: an `EmbedRequest` as the request task's
//! [`EmbedSpec`], and its [`Embedded`] answer as an `EmbedResponse`. The
//! OpenAI door's `/v1/embeddings` (`api::openai::embeddings`) starts the same
//! task through the same intake; errors go through the one error table.

use tokio::time::Instant;

use crate::embeddings::{EmbedSpec, Embedded};
use crate::error::RequestError;
use crate::proto;
use crate::semantic::embed::Input;

/// The gRPC request as the request task's call (limits are checked by the
/// intake).
pub fn spec(
    r: proto::EmbedRequest,
    request_id: String,
    deadline: Option<Instant>,
) -> Result<EmbedSpec, RequestError> {
    let input = match (r.texts.is_empty(), r.tokens.is_empty()) {
        (false, false) => {
            return Err(RequestError::InvalidRequest(
                "texts: set `texts` or `tokens`, not both".into(),
            ))
        }
        (true, false) => Input::Tokens(r.tokens.into_iter().map(|t| t.ids).collect()),
        _ => Input::Texts(r.texts),
    };
    let pin = match r.target.as_str() {
        "" => None,
        t if t
            .split_once('/')
            .is_some_and(|(p, m)| !p.is_empty() && !m.is_empty()) =>
        {
            Some(r.target)
        }
        t => {
            return Err(RequestError::InvalidRequest(format!(
                "target: `{t}` is not `provider/model`"
            )))
        }
    };
    Ok(EmbedSpec {
        request_id,
        route: r.route,
        pin,
        tenant: if r.tenant.is_empty() {
            "default".into()
        } else {
            r.tenant
        },
        input,
        dimensions: (r.dimensions > 0).then_some(r.dimensions),
        user: (!r.user.is_empty()).then_some(r.user),
        deadline,
        base64: false,
    })
}

/// The served call as the gRPC answer.
pub fn response(e: Embedded, request_id: String) -> proto::EmbedResponse {
    proto::EmbedResponse {
        embeddings: e
            .vectors
            .into_iter()
            .map(|values| proto::Embedding { values })
            .collect(),
        served_by: Some(proto::ServedBy {
            provider: e.provider.into(),
            model: e.model.into(),
        }),
        tier: crate::api::convert::tier(e.tier) as i32,
        attempts: e.attempts,
        request_id,
        usage: Some(proto::Usage {
            input_tokens: e.input_tokens,
            estimated: e.usage_estimated,
            ..Default::default()
        }),
        cost_usd: e.cost_usd,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn texts_or_tokens_not_both_and_a_sane_target() {
        let r = |texts: Vec<&str>, tokens: Vec<Vec<u32>>, target: &str| proto::EmbedRequest {
            route: "embed".into(),
            texts: texts.into_iter().map(String::from).collect(),
            tokens: tokens
                .into_iter()
                .map(|ids| proto::TokenIds { ids })
                .collect(),
            target: target.into(),
            ..Default::default()
        };
        let s = spec(r(vec!["a"], vec![], ""), "id".into(), None).unwrap();
        assert_eq!(s.input, Input::Texts(vec!["a".into()]));
        assert_eq!(s.tenant, "default");
        let s = spec(r(vec![], vec![vec![1, 2]], "p/m"), "id".into(), None).unwrap();
        assert_eq!(s.input, Input::Tokens(vec![vec![1, 2]]));
        assert_eq!(s.pin.as_deref(), Some("p/m"));
        assert!(spec(r(vec!["a"], vec![vec![1]], ""), "id".into(), None).is_err());
        assert!(spec(r(vec!["a"], vec![], "nope"), "id".into(), None).is_err());
    }
}
