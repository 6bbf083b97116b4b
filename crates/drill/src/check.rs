//! Evaluates a scenario's assertions over the phase results: each becomes a
//! measured value, a verdict and a one-line description. Pure functions over
//! recorded data; measuring never talks to the router or the mocks.

use super::report::code_name;
use super::run::{PhaseResult, RequestResult};
use super::scenario::{Assertion, What};

/// One evaluated assertion.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub pass: bool,
    /// E.g. `upstream_attempts[primary] in outage <= 6`.
    pub label: String,
    /// What was measured, e.g. `3` or `open`.
    pub actual: String,
}

/// Evaluates every assertion.
pub fn evaluate(asserts: &[Assertion], phases: &[PhaseResult]) -> Vec<Verdict> {
    asserts.iter().map(|a| verdict(a, phases)).collect()
}

fn scope<'a>(a: &Assertion, phases: &'a [PhaseResult]) -> Vec<&'a PhaseResult> {
    match &a.phase {
        Some(name) => phases.iter().filter(|p| &p.name == name).collect(),
        None => phases.iter().collect(),
    }
}

fn label(a: &Assertion) -> String {
    let mut s = a.what.as_str().to_string();
    let mut args: Vec<String> = Vec::new();
    for v in [&a.mock, &a.provider, &a.code, &a.reason]
        .into_iter()
        .flatten()
    {
        args.push(v.clone());
    }
    if !args.is_empty() {
        s.push_str(&format!("[{}]", args.join(",")));
    }
    match &a.phase {
        Some(p) => s.push_str(&format!(" in {p}")),
        None if a.what == What::Breaker => s.push_str(" at the end"),
        None => s.push_str(" overall"),
    }
    let rhs = match (&a.state, a.value) {
        (Some(state), _) => state.clone(),
        (None, Some(v)) => fmt_num(v),
        (None, None) => String::new(),
    };
    format!("{s} {} {rhs}", a.op.as_str())
}

fn verdict(a: &Assertion, phases: &[PhaseResult]) -> Verdict {
    let scoped = scope(a, phases);
    if a.what == What::Breaker {
        return breaker(a, &scoped);
    }
    let actual = measure(a, &scoped);
    let expected = a.value.unwrap_or(0.0);
    Verdict {
        pass: actual.is_some_and(|v| a.op.holds(v, expected)),
        label: label(a),
        actual: actual.map_or_else(|| "n/a".to_string(), fmt_num),
    }
}

fn breaker(a: &Assertion, scoped: &[&PhaseResult]) -> Verdict {
    let provider = a.provider.clone().unwrap_or_default();
    let state = scoped
        .last()
        .and_then(|p| p.end.as_ref())
        .and_then(|s| s.breakers.get(&provider).cloned());
    let want = a.state.clone().unwrap_or_default();
    let pass = match &state {
        Some(s) => a.op.holds(f64::from(u8::from(*s == want)), 1.0),
        None => false,
    };
    Verdict {
        pass,
        label: label(a),
        actual: state.unwrap_or_else(|| "unknown (no router status)".into()),
    }
}

fn requests<'a: 'b, 'b>(
    scoped: &'b [&'a PhaseResult],
) -> impl Iterator<Item = &'a RequestResult> + 'b {
    scoped.iter().copied().flat_map(|p| p.requests.iter())
}

fn share(num: usize, den: usize) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The measured value, `None` when there is nothing to measure.
fn measure(a: &Assertion, scoped: &[&PhaseResult]) -> Option<f64> {
    let total = requests(scoped).count();
    let mock = a.mock.clone().unwrap_or_default();
    match a.what {
        What::Availability => share(requests(scoped).filter(|r| r.ok).count(), total),
        What::Errors => Some(requests(scoped).filter(|r| error_matches(a, r)).count() as f64),
        What::ServedBy => {
            let p = a.provider.as_deref().unwrap_or_default();
            let n = requests(scoped)
                .filter(|r| r.served_by.as_ref().is_some_and(|(sp, _)| sp == p))
                .count();
            share(n, total)
        }
        What::UpstreamAttempts => Some(
            scoped
                .iter()
                .map(|p| p.upstream.get(&mock).map_or(0, Vec::len))
                .sum::<usize>() as f64,
        ),
        What::MaxInFlight => scoped
            .iter()
            .filter_map(|p| p.max_in_flight.get(&mock))
            .max()
            .map(|m| f64::from(*m)),
        What::AttemptsPerRequest => requests(scoped)
            .map(|r| f64::from(r.attempts))
            .reduce(f64::max),
        What::Resets => Some(requests(scoped).map(|r| f64::from(r.resets)).sum()),
        What::CleanAnswers => {
            let ok = requests(scoped).filter(|r| r.ok).count();
            let clean = requests(scoped).filter(|r| r.ok && r.clean).count();
            Some(share(clean, ok).unwrap_or(1.0))
        }
        What::Breaker => None,
    }
}

fn error_matches(a: &Assertion, r: &RequestResult) -> bool {
    if r.ok {
        return false;
    }
    let code_ok = a.code.as_deref().is_none_or(|c| {
        r.code
            .is_some_and(|rc| code_name(rc).eq_ignore_ascii_case(c))
    });
    let reason_ok = a.reason.as_deref().is_none_or(|x| r.reason == x);
    code_ok && reason_ok
}

/// Integers without decimals, shares with three.
pub fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::scenario::Op;

    fn assertion(what: What, op: Op, value: f64) -> Assertion {
        Assertion {
            what,
            phase: None,
            mock: None,
            provider: None,
            code: None,
            reason: None,
            op,
            value: Some(value),
            state: None,
        }
    }

    fn phase() -> PhaseResult {
        let ok = RequestResult {
            ok: true,
            served_by: Some(("secondary".into(), "m".into())),
            attempts: 2,
            clean: true,
            ..RequestResult::default()
        };
        let bad = RequestResult {
            code: Some(tonic::Code::Unavailable),
            reason: "UPSTREAM_SERVER_ERROR".into(),
            attempts: 3,
            ..RequestResult::default()
        };
        PhaseResult {
            name: "outage".into(),
            requests: vec![ok.clone(), ok, bad],
            ..PhaseResult::default()
        }
    }

    #[test]
    fn drill_measures_shares_counts_and_maxima() {
        let p = [phase()];
        let v = evaluate(&[assertion(What::Availability, Op::Ge, 0.6)], &p);
        assert!(v[0].pass, "{v:?}");
        assert_eq!(v[0].actual, "0.667");
        let mut e = assertion(What::Errors, Op::Eq, 1.0);
        e.code = Some("UNAVAILABLE".into());
        let mut s = assertion(What::ServedBy, Op::Eq, 1.0);
        s.provider = Some("secondary".into());
        let v = evaluate(
            &[e, s, assertion(What::AttemptsPerRequest, Op::Le, 2.0)],
            &p,
        );
        assert!(v[0].pass);
        assert!(!v[1].pass, "{v:?}");
        assert!(!v[2].pass);
        assert_eq!(v[2].actual, "3");
    }
}
