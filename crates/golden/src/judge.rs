//! Judging answers to a golden set, pure: each case's answer from a target
//! against the case (JSON schema, refusal, tool call name and arguments)
//! and against the route's first target's answer (similarity), then one
//! verdict per target. Similarity is the cosine of the answers' embeddings
//! when an embedder is configured, else of their word counts (lexical).

use std::collections::HashMap;

use serde_json::Value;

use super::set::Case;
use switchyard::state::validation::record::TargetValidation;

/// What a target answered to one case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub text: String,
    /// Complete calls: name and JSON arguments.
    pub tool_calls: Vec<(String, String)>,
    /// The model stopped with a refusal or content filter.
    pub refused: bool,
    /// Why the call failed (no answer to judge), if it did.
    pub error: Option<String>,
    /// Served live by the target itself (not a cache, not another target).
    pub live: bool,
}

/// One case's findings for one target.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaseResult {
    pub schema_valid: Option<bool>,
    pub refusal_agreed: Option<bool>,
    pub tool_agreed: Option<bool>,
    pub similarity: f64,
    pub failures: Vec<String>,
}

fn matches_schema(schema: &Value, instance: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let first = validator
        .iter_errors(instance)
        .next()
        .map(|e| format!("{e} at `{}`", e.instance_path()));
    match first {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// Judges one answer (`similarity` to the first target's answer given).
pub fn judge(case: &Case, answer: &Answer, similarity: f64) -> CaseResult {
    let mut r = CaseResult {
        similarity,
        ..CaseResult::default()
    };
    let at = &case.name;
    if let Some(e) = &answer.error {
        r.failures.push(format!("{at}: no answer: {e}"));
        r.schema_valid = case.schema.as_ref().map(|_| false);
        r.refusal_agreed = case.refusal.map(|_| false);
        r.tool_agreed = case.expect_tool.as_ref().map(|_| false);
        return r;
    }
    if !answer.live {
        r.failures.push(format!(
            "{at}: not answered live by the target (a cache or another target served)"
        ));
    }
    if let Some(schema) = &case.schema {
        let verdict = serde_json::from_str::<Value>(answer.text.trim())
            .map_err(|e| format!("not JSON ({e})"))
            .and_then(|v| matches_schema(schema, &v));
        if let Err(e) = &verdict {
            r.failures.push(format!("{at}: structured output: {e}"));
        }
        r.schema_valid = Some(verdict.is_ok());
    }
    if let Some(expected) = case.refusal {
        let agreed = answer.refused == expected;
        if !agreed {
            r.failures.push(format!(
                "{at}: refusal: expected {}, the target {}",
                if expected { "a refusal" } else { "an answer" },
                if answer.refused {
                    "refused"
                } else {
                    "answered"
                }
            ));
        }
        r.refusal_agreed = Some(agreed);
    }
    if let Some(name) = &case.expect_tool {
        let verdict = match answer.tool_calls.iter().find(|(n, _)| n == name) {
            None => Err(format!(
                "expected a call of `{name}`, got {}",
                if answer.tool_calls.is_empty() {
                    "none".to_string()
                } else {
                    answer
                        .tool_calls
                        .iter()
                        .map(|(n, _)| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )),
            Some((_, args)) => serde_json::from_str::<Value>(args)
                .map_err(|e| format!("arguments are not JSON ({e})"))
                .and_then(|v| match case.arguments_schema() {
                    Some(s) => matches_schema(s, &v).map_err(|e| format!("arguments: {e}")),
                    None => Ok(()),
                }),
        };
        if let Err(e) = &verdict {
            r.failures.push(format!("{at}: tool call: {e}"));
        }
        r.tool_agreed = Some(verdict.is_ok());
    }
    r
}

fn words(text: &str) -> HashMap<String, f64> {
    let mut m = HashMap::new();
    for w in text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        *m.entry(w.to_string()).or_insert(0.0) += 1.0;
    }
    m
}

/// Cosine similarity of two texts' word counts (1 for two empty texts).
pub fn lexical_similarity(a: &str, b: &str) -> f64 {
    let (wa, wb) = (words(a), words(b));
    if wa.is_empty() && wb.is_empty() {
        return 1.0;
    }
    let dot: f64 = wa.iter().map(|(w, n)| n * wb.get(w).unwrap_or(&0.0)).sum();
    let norm = |m: &HashMap<String, f64>| m.values().map(|n| n * n).sum::<f64>().sqrt();
    let d = norm(&wa) * norm(&wb);
    if d == 0.0 {
        0.0
    } else {
        dot / d
    }
}

/// A target's verdict over every case: validated when every applicable
/// check passed on every case and the mean similarity reached
/// `min_similarity` (when one is required).
pub fn verdict(
    target: &str,
    results: &[CaseResult],
    similarity_kind: &str,
    min_similarity: Option<f64>,
) -> TargetValidation {
    let count = |f: fn(&CaseResult) -> Option<bool>| {
        let applicable = results.iter().filter_map(f);
        let (mut n, mut ok) = (0u32, 0u32);
        for v in applicable {
            n += 1;
            ok += u32::from(v);
        }
        (n, ok)
    };
    let (schema_cases, schema_valid) = count(|r| r.schema_valid);
    let (refusal_cases, refusal_agreed) = count(|r| r.refusal_agreed);
    let (tool_cases, tool_agreed) = count(|r| r.tool_agreed);
    let mean = if results.is_empty() {
        0.0
    } else {
        results.iter().map(|r| r.similarity).sum::<f64>() / results.len() as f64
    };
    let mut failures: Vec<String> = results.iter().flat_map(|r| r.failures.clone()).collect();
    if let Some(min) = min_similarity.filter(|m| mean < *m) {
        failures.push(format!(
            "answer similarity {mean:.3} ({similarity_kind}) is below {min:.3}"
        ));
    }
    TargetValidation {
        target: target.to_string(),
        validated: failures.is_empty(),
        cases: results.len() as u32,
        schema_cases,
        schema_valid,
        refusal_cases,
        refusal_agreed,
        tool_cases,
        tool_agreed,
        answer_similarity: mean,
        similarity_kind: similarity_kind.to_string(),
        failures,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::set::parse;

    fn cases() -> Vec<Case> {
        parse(
            r#"
[[case]]
name = "json"
prompt = "status as JSON"
schema = { type = "object", required = ["answer"], properties = { answer = { type = "string" } } }
[[case]]
name = "harm"
prompt = "something harmful"
refusal = true
[[case]]
name = "tool"
prompt = "where is order 42"
expect_tool = "lookup"
  [[case.tools]]
  name = "lookup"
  parameters = { type = "object", required = ["query"], properties = { query = { type = "string" } } }
"#,
            false,
        )
        .unwrap()
    }

    fn live(text: &str) -> Answer {
        Answer {
            text: text.into(),
            live: true,
            ..Answer::default()
        }
    }

    #[test]
    fn each_check_passes_and_fails_for_its_reason() {
        let c = cases();
        let ok = judge(&c[0], &live(r#"{"answer": "shipped"}"#), 1.0);
        assert_eq!(ok.schema_valid, Some(true));
        assert!(ok.failures.is_empty(), "{:?}", ok.failures);
        let off = judge(&c[0], &live(r#"{"reply": "shipped"}"#), 1.0);
        assert_eq!(off.schema_valid, Some(false));
        assert!(off.failures[0].contains("answer"), "{:?}", off.failures);
        let prose = judge(&c[0], &live("It shipped."), 1.0);
        assert!(prose.failures[0].contains("not JSON"));

        let refused = Answer {
            refused: true,
            ..live("I can't help with that.")
        };
        assert_eq!(judge(&c[1], &refused, 1.0).refusal_agreed, Some(true));
        let complied = judge(&c[1], &live("Sure, here is how"), 1.0);
        assert_eq!(complied.refusal_agreed, Some(false));
        assert!(complied.failures[0].contains("expected a refusal"));

        let call = |name: &str, args: &str| Answer {
            tool_calls: vec![(name.into(), args.into())],
            ..live("")
        };
        assert_eq!(
            judge(&c[2], &call("lookup", r#"{"query":"42"}"#), 1.0).tool_agreed,
            Some(true)
        );
        let wrong_args = judge(&c[2], &call("lookup", r#"{"q":42}"#), 1.0);
        assert_eq!(wrong_args.tool_agreed, Some(false));
        assert!(wrong_args.failures[0].contains("arguments"));
        let other = judge(&c[2], &call("cancel", "{}"), 1.0);
        assert!(other.failures[0].contains("`cancel`"));
        assert!(judge(&c[2], &live("it is on its way"), 1.0).failures[0].contains("none"));

        let cached = Answer {
            live: false,
            ..live(r#"{"answer": "x"}"#)
        };
        assert!(judge(&c[0], &cached, 1.0).failures[0].contains("not answered live"));
        let failed = Answer {
            error: Some("UNAVAILABLE".into()),
            ..Answer::default()
        };
        let r = judge(&c[0], &failed, 0.0);
        assert_eq!(r.schema_valid, Some(false));
        assert!(r.failures[0].contains("no answer"));
    }

    #[test]
    fn the_verdict_needs_every_check_and_the_similarity() {
        let c = cases();
        let good = vec![
            judge(&c[0], &live(r#"{"answer": "a"}"#), 0.9),
            judge(
                &c[1],
                &Answer {
                    refused: true,
                    ..live("no")
                },
                0.9,
            ),
        ];
        let v = verdict("p/m", &good, "lexical", Some(0.8));
        assert!(v.validated, "{:?}", v.failures);
        assert_eq!(
            (
                v.schema_cases,
                v.schema_valid,
                v.refusal_cases,
                v.refusal_agreed
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(v.tool_cases, 0);
        assert!((v.answer_similarity - 0.9).abs() < 1e-9);
        let v = verdict("p/m", &good, "lexical", Some(0.95));
        assert!(!v.validated);
        assert!(v.failures[0].contains("below"));
        assert!(verdict("p/m", &good, "lexical", None).validated);
        let bad = vec![judge(&c[0], &live("prose"), 1.0)];
        let v = verdict("q/n", &bad, "lexical", None);
        assert!(!v.validated);
        assert_eq!((v.schema_cases, v.schema_valid), (1, 0));
    }

    #[test]
    fn lexical_similarity_is_the_cosine_of_word_counts() {
        assert_eq!(lexical_similarity("", ""), 1.0);
        assert_eq!(lexical_similarity("a b", ""), 0.0);
        assert!((lexical_similarity("The cat sat", "the CAT sat!") - 1.0).abs() < 1e-9);
        let s = lexical_similarity("a b", "a c");
        assert!((s - 0.5).abs() < 1e-9, "{s}");
    }
}
