//! The Prometheus text exposition as `switchyard plan --admin` reads it:
//! sample lines parsed into name, labels and value, and the difference of two
//! scrapes turned into [`Observed`] rates. Parsing and arithmetic only; the
//! HTTP calls live in `source`.

use std::collections::BTreeMap;

use super::model::Observed;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> String {
        self.labels.get(name).cloned().unwrap_or_default()
    }
}

/// A whole scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
}

/// Parses `{a="x",b="y\"z"}` (the braces excluded) into labels.
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim_start_matches([',', ' ']);
    while !rest.is_empty() {
        let (name, after) = rest.split_once('=')?;
        let mut chars = after.strip_prefix('"')?.chars();
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        labels.insert(name.trim().to_string(), value);
        rest = chars.as_str().trim_start_matches([',', ' ']);
    }
    Some(labels)
}

/// Parses one sample line; `None` for comments, blanks and malformed lines.
fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find(['{', ' ']) {
        Some(i) if line.as_bytes()[i] == b'{' => {
            let close = line.rfind('}')?;
            (
                &line[..i],
                parse_labels(&line[i + 1..close])?,
                &line[close + 1..],
            )
        }
        Some(i) => (&line[..i], BTreeMap::new(), &line[i..]),
        None => return None,
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        Scrape {
            samples: text.lines().filter_map(parse_line).collect(),
        }
    }

    /// Sums `name` by the values of `keys`, over samples that `keep` accepts.
    pub fn sum_by(
        &self,
        name: &str,
        keys: &[&str],
        keep: impl Fn(&Sample) -> bool,
    ) -> BTreeMap<Vec<String>, f64> {
        let mut out = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == name && keep(s)) {
            let k: Vec<String> = keys.iter().map(|k| s.label(k)).collect();
            *out.entry(k).or_insert(0.0) += s.value;
        }
        out
    }
}

/// `after - before` per key, divided by `secs` (a counter reset counts from zero).
fn rates(
    before: &BTreeMap<Vec<String>, f64>,
    after: &BTreeMap<Vec<String>, f64>,
    secs: f64,
) -> BTreeMap<Vec<String>, f64> {
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or(0.0);
            let d = if *a >= b { a - b } else { *a };
            (k.clone(), d / secs)
        })
        .collect()
}

/// Two-label keys as pairs (other keys cannot occur: every `sum_by` here has two).
fn pairs<V>(m: BTreeMap<Vec<String>, V>) -> BTreeMap<(String, String), V> {
    m.into_iter()
        .filter_map(|(k, v)| match k.as_slice() {
            [a, b] => Some(((a.clone(), b.clone()), v)),
            _ => None,
        })
        .collect()
}

const SERVED: &str = "switchyard_requests_served_total";
const SHED: &str = "switchyard_requests_shed_total";
const ATTEMPTS: &str = "switchyard_upstream_attempts_total";
const DURATION_SUM: &str = "gen_ai_client_operation_duration_seconds_sum";
const DURATION_COUNT: &str = "gen_ai_client_operation_duration_seconds_count";
const BREAKER: &str = "switchyard_breaker_state";
const WINDOW_LIMIT: &str = "switchyard_key_window_limit";

/// The metric names [`observe`] reads (the metric-name test checks them).
pub const METRICS_READ: &[&str] = &[
    SERVED,
    SHED,
    ATTEMPTS,
    DURATION_SUM,
    DURATION_COUNT,
    BREAKER,
];

/// The breaker gauge's value as a phase name.
pub fn breaker_phase(value: f64) -> &'static str {
    match value as i64 {
        0 => "closed",
        1 => "half_open",
        _ => "open",
    }
}

/// Rates over `secs` between two scrapes of one replica.
pub fn observe(before: &Scrape, after: &Scrape, secs: f64) -> Observed {
    let live = |s: &Sample| matches!(s.label("tier").as_str(), "primary" | "fallback");
    let all = |_: &Sample| true;
    let target = ["provider", "gen_ai_request_model"];
    let served = rates(
        &before.sum_by(SERVED, &["route", "provider"], live),
        &after.sum_by(SERVED, &["route", "provider"], live),
        secs,
    );
    let shed = rates(
        &before.sum_by(SHED, &["route", "reason"], all),
        &after.sum_by(SHED, &["route", "reason"], all),
        secs,
    );
    let attempts_by = |s: &Scrape, limited: bool| {
        s.sum_by(ATTEMPTS, &["provider", "model"], |x| {
            !limited || x.label("outcome") == "rate_limited"
        })
    };
    let attempts = rates(
        &attempts_by(before, false),
        &attempts_by(after, false),
        secs,
    );
    let limited = rates(&attempts_by(before, true), &attempts_by(after, true), secs);
    // Mean duration over the window; a target without attempts in it keeps
    // its mean since start, so a secondary that served once is still known.
    let (sum0, sum1) = (
        before.sum_by(DURATION_SUM, &target, all),
        after.sum_by(DURATION_SUM, &target, all),
    );
    let (n0, n1) = (
        before.sum_by(DURATION_COUNT, &target, all),
        after.sum_by(DURATION_COUNT, &target, all),
    );
    let duration = n1
        .iter()
        .filter_map(|(k, n)| {
            let s = sum1.get(k).copied().unwrap_or(0.0);
            let dn = n - n0.get(k).copied().unwrap_or(0.0);
            let ds = s - sum0.get(k).copied().unwrap_or(0.0);
            let mean = if dn > 0.0 {
                ds / dn
            } else if *n > 0.0 {
                s / n
            } else {
                return None;
            };
            Some((k.clone(), mean))
        })
        .collect();
    let breakers = after
        .sum_by(BREAKER, &["provider", "model"], all)
        .into_iter()
        .map(|(k, v)| (k, breaker_phase(v).to_string()))
        .collect();
    // Each key's request window (a gauge: the latest scrape), by provider.
    let upstream_rpm = after
        .sum_by(WINDOW_LIMIT, &["provider"], |s| {
            s.label("kind") == "requests"
        })
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_iter().next()?, v)))
        .collect();
    Observed {
        window_secs: secs,
        replicas: 1.0,
        upstream_rpm,
        served: pairs(served),
        shed: pairs(shed),
        duration: pairs(duration),
        attempts: pairs(attempts),
        rate_limited: pairs(limited),
        breakers: pairs(breakers),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sample_lines_parse_with_escapes_and_without_labels() {
        let s = Scrape::parse(
            "# TYPE x counter\nx_total{a=\"1\",b=\"q\\\"z\"} 3\nplain 2.5\n\n# EOF\n",
        );
        assert_eq!(s.samples.len(), 2);
        assert_eq!(s.samples[0].name, "x_total");
        assert_eq!(s.samples[0].labels["b"], "q\"z");
        assert_eq!(s.samples[0].value, 3.0);
        assert_eq!(s.samples[1].name, "plain");
        assert!(s.samples[1].labels.is_empty());
    }

    fn scrape(served: f64, count: f64, sum: f64) -> Scrape {
        Scrape::parse(&format!(
            "switchyard_requests_served_total{{route=\"chat\",tier=\"primary\",provider=\"a\"}} {served}\n\
             switchyard_requests_served_total{{route=\"chat\",tier=\"cache\",provider=\"\"}} 100\n\
             switchyard_upstream_attempts_total{{provider=\"a\",model=\"m\",outcome=\"ok\"}} {served}\n\
             switchyard_upstream_attempts_total{{provider=\"a\",model=\"m\",outcome=\"rate_limited\"}} 4\n\
             gen_ai_client_operation_duration_seconds_sum{{gen_ai_provider_name=\"openai\",gen_ai_request_model=\"m\",gen_ai_operation_name=\"chat\",provider=\"a\"}} {sum}\n\
             gen_ai_client_operation_duration_seconds_count{{gen_ai_provider_name=\"openai\",gen_ai_request_model=\"m\",gen_ai_operation_name=\"chat\",provider=\"a\"}} {count}\n\
             switchyard_breaker_state{{provider=\"a\",model=\"m\"}} 2\n"
        ))
    }

    #[test]
    fn two_scrapes_give_rates_and_the_window_mean_duration() {
        let o = observe(&scrape(10.0, 14.0, 2.0), &scrape(30.0, 34.0, 8.0), 10.0);
        let k = ("a".to_string(), "m".to_string());
        // Live tiers only: the cache answers are not the target's.
        assert_eq!(o.served[&("chat".to_string(), "a".to_string())], 2.0);
        assert_eq!(o.attempts[&k], 2.0);
        assert_eq!(o.rate_limited[&k], 0.0);
        // (8 - 2) / (34 - 14)
        assert!((o.duration[&k] - 0.3).abs() < 1e-12);
        assert_eq!(o.breakers[&k], "open");
    }

    #[test]
    fn a_target_idle_in_the_window_keeps_its_mean_since_start() {
        let o = observe(&scrape(10.0, 4.0, 2.0), &scrape(10.0, 4.0, 2.0), 10.0);
        assert_eq!(o.duration[&("a".to_string(), "m".to_string())], 0.5);
    }

    #[test]
    fn a_counter_reset_counts_from_zero() {
        let o = observe(&scrape(50.0, 4.0, 2.0), &scrape(5.0, 4.0, 2.0), 5.0);
        assert_eq!(o.served[&("chat".to_string(), "a".to_string())], 1.0);
    }
}
