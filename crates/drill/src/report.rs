//! Plain-text rendering of a drill: the per-request progress line, the
//! summary table per phase (requests, errors by code, attempts per mock,
//! served-by shares, TTFT percentiles) and the assertion list. Formatting
//! only; the numbers come from `run` and `check`.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::Code;

use switchyard_mock::RequestRecord;

use super::check::Verdict;
use super::control::Snapshot;
use super::run::{PhaseResult, RequestResult};
use super::scenario::Phase;

const CODES: &[(Code, &str)] = &[
    (Code::Ok, "OK"),
    (Code::Cancelled, "CANCELLED"),
    (Code::Unknown, "UNKNOWN"),
    (Code::InvalidArgument, "INVALID_ARGUMENT"),
    (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
    (Code::NotFound, "NOT_FOUND"),
    (Code::AlreadyExists, "ALREADY_EXISTS"),
    (Code::PermissionDenied, "PERMISSION_DENIED"),
    (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (Code::FailedPrecondition, "FAILED_PRECONDITION"),
    (Code::Aborted, "ABORTED"),
    (Code::OutOfRange, "OUT_OF_RANGE"),
    (Code::Unimplemented, "UNIMPLEMENTED"),
    (Code::Internal, "INTERNAL"),
    (Code::Unavailable, "UNAVAILABLE"),
    (Code::DataLoss, "DATA_LOSS"),
    (Code::Unauthenticated, "UNAUTHENTICATED"),
];

/// `UNAVAILABLE` for `Code::Unavailable`.
pub fn code_name(code: Code) -> &'static str {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("UNKNOWN", |(_, n)| n)
}

/// The code for a name such as `UNAVAILABLE` (case-insensitive).
pub fn code_from_name(name: &str) -> Option<Code> {
    CODES
        .iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(name))
        .map(|(c, _)| *c)
}

/// `; faults: primary=status` for the phase header.
pub fn describe_faults(phase: &Phase) -> String {
    if phase.fault_specs.is_empty() {
        return String::new();
    }
    let list: Vec<String> = phase
        .fault_specs
        .iter()
        .map(|(m, s)| {
            let json = serde_json::to_string(s).unwrap_or_default();
            format!("{m}={json}")
        })
        .collect();
    format!("; faults: {}", list.join(" "))
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// One upstream attempt as the mock saw it: `500`, `200 abort tok=100`, `529 over-capacity`.
pub fn describe_record(r: &RequestRecord) -> String {
    let mut s = r.status.map_or_else(|| "-".to_string(), |s| s.to_string());
    if r.max_tokens == Some(1) {
        s = format!("probe {s}");
    }
    if r.over_capacity {
        s.push_str(" over-capacity");
    } else if let Some(f) = r
        .fault
        .as_deref()
        .filter(|f| !matches!(*f, "none" | "status"))
    {
        s.push(' ');
        s.push_str(f);
    }
    if r.tokens_sent > 0 {
        s.push_str(&format!(" tok={}", r.tokens_sent));
    }
    s
}

fn breakers(s: &Snapshot) -> String {
    s.breakers
        .iter()
        .map(|(p, b)| format!("{p}={b}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The line printed after each request of a sequential phase.
pub fn request_line(
    phase: &str,
    r: &RequestResult,
    upstream: &[(String, Vec<RequestRecord>)],
    snapshot: Option<&Snapshot>,
) -> String {
    let mut line = format!("#{:<4} {:<10} ", r.n, phase);
    if r.ok {
        let (p, m) = r.served_by.clone().unwrap_or_default();
        line.push_str(&format!(
            "ok   {:<14} {:<9}",
            format!("{p}/{m}"),
            r.tier.as_deref().unwrap_or("-")
        ));
    } else {
        let code = r.code.map_or("-", code_name);
        line.push_str(&format!("ERR  {code} {}", r.reason));
    }
    line.push_str(&format!("  attempts={}", r.attempts));
    if let Some(t) = r.ttft {
        line.push_str(&format!("  ttft={}", ms(t)));
    }
    line.push_str(&format!("  tokens={}", r.tokens));
    if r.resets > 0 {
        line.push_str(&format!("  resets={}", r.resets));
    }
    let ups: Vec<String> = upstream
        .iter()
        .filter(|(_, recs)| !recs.is_empty())
        .map(|(name, recs)| {
            let each: Vec<String> = recs.iter().map(describe_record).collect();
            format!("{name}: {}", each.join(", "))
        })
        .collect();
    line.push_str(" | ");
    line.push_str(&if ups.is_empty() {
        "no upstream attempt".to_string()
    } else {
        ups.join("; ")
    });
    if let Some(s) = snapshot {
        line.push_str(&format!(" | breakers: {}", breakers(s)));
        if let Some(b) = s.budget {
            line.push_str(&format!(" | budget {b:.1}"));
        }
    }
    line
}

/// The `p`-th percentile (nearest rank) of the streamed requests' TTFT.
fn percentile(requests: &[RequestResult], p: f64) -> Option<Duration> {
    let mut v: Vec<Duration> = requests.iter().filter_map(|r| r.ttft).collect();
    if v.is_empty() {
        return None;
    }
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v.get(rank - 1).copied()
}

fn errors_by_code(requests: &[RequestResult]) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| !r.ok) {
        let key = match (r.code, r.reason.as_str()) {
            (Some(c), "") => code_name(c).to_string(),
            (Some(c), reason) => format!("{}/{reason}", code_name(c)),
            (None, _) => "NO_FINISH".into(),
        };
        *by.entry(key).or_default() += 1;
    }
    join_counts(by.into_iter())
}

fn join_counts(items: impl Iterator<Item = (String, usize)>) -> String {
    let v: Vec<String> = items.map(|(k, n)| format!("{k}={n}")).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(" ")
    }
}

fn served_shares(requests: &[RequestResult]) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        if let Some((p, _)) = &r.served_by {
            *by.entry(p.clone()).or_default() += 1;
        }
    }
    let total = requests.len().max(1) as f64;
    let v: Vec<String> = by
        .into_iter()
        .map(|(p, n)| format!("{p} {:.0}%", 100.0 * n as f64 / total))
        .collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(" ")
    }
}

fn phase_row(p: &PhaseResult) -> Vec<String> {
    let ok = p.requests.iter().filter(|r| r.ok).count();
    let attempts = join_counts(p.upstream.iter().map(|(m, recs)| (m.clone(), recs.len())));
    let in_flight = join_counts(
        p.max_in_flight
            .iter()
            .map(|(m, n)| (m.clone(), *n as usize)),
    );
    let resets: u32 = p.requests.iter().map(|r| r.resets).sum();
    let ttft = |q| percentile(&p.requests, q).map_or_else(|| "-".into(), ms);
    vec![
        p.name.clone(),
        p.requests.len().to_string(),
        ok.to_string(),
        errors_by_code(&p.requests),
        attempts,
        in_flight,
        served_shares(&p.requests),
        resets.to_string(),
        ttft(0.5),
        ttft(0.95),
        p.end.as_ref().map_or_else(|| "?".into(), breakers),
        ms(p.elapsed),
    ]
}

/// Aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let render = |cells: Vec<&str>| {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        line.join("  ").trim_end().to_string()
    };
    let mut out = render(header.to_vec());
    out.push('\n');
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for row in rows {
        out.push_str(&render(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// The summary table of all phases.
pub fn summary(phases: &[PhaseResult]) -> String {
    let header = [
        "phase",
        "reqs",
        "ok",
        "errors",
        "upstream attempts",
        "max in flight",
        "served by",
        "resets",
        "ttft p50",
        "ttft p95",
        "breakers at end",
        "took",
    ];
    let rows: Vec<Vec<String>> = phases.iter().map(phase_row).collect();
    table(&header, &rows)
}

/// The assertion list with PASS/FAIL and the measured values.
pub fn verdicts(list: &[Verdict]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|v| {
            vec![
                if v.pass { "PASS" } else { "FAIL" }.to_string(),
                v.label.clone(),
                format!("actual {}", v.actual),
            ]
        })
        .collect();
    table(&["result", "assertion", "measured"], &rows)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn drill_table_aligns_columns() {
        let t = table(
            &["a", "bbb"],
            &[
                vec!["xxxx".into(), "y".into()],
                vec!["z".into(), "w".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "a     bbb");
        assert_eq!(lines[1], "----  ---");
        assert_eq!(lines[2], "xxxx  y");
    }

    #[test]
    fn drill_code_names_round_trip() {
        assert_eq!(code_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(code_from_name("unavailable"), Some(Code::Unavailable));
        assert_eq!(code_from_name("NOPE"), None);
    }
}
