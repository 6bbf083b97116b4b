//! Turns upstream failure signals (HTTP status + headers + body, a mid-stream
//! error object, a transport error) into one classified [`Failure`] (DESIGN.md §3,
//! reference C.2). Pure functions over bytes and values, time passed in.
//! Must never copy an upstream 401/403 body, a key or a header value other than
//! the request id into a message.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use serde_json::Value;

use crate::policy::outcome::{Failure, OutcomeClass};

/// Longest upstream message copied into a [`Failure`] (in characters).
const MAX_MESSAGE_CHARS: usize = 300;

/// Fixed message for auth failures: the upstream body is never forwarded.
const AUTH_MESSAGE: &str = "upstream rejected the router's credentials for this provider";

/// The parts of an upstream error object that drive classification, parsed leniently.
#[derive(Debug, Default, PartialEq)]
struct ErrorFields {
    /// `error.type` (OpenAI, Anthropic, vLLM exception name).
    kind: Option<String>,
    /// `error.code`, integers rendered as strings.
    code: Option<String>,
    /// `error.message`, or the string in `{"error": "..."}`.
    message: Option<String>,
    /// Anthropic `error.details.error_code`.
    detail_code: Option<String>,
    /// Google's `error.status` (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`, …).
    status: Option<String>,
    /// Google's `details`: `ErrorInfo.reason`, a per-day `QuotaFailure`,
    /// `RetryInfo.retryDelay`.
    google: GoogleDetails,
}

/// What Google's `error.details` say (reference D.5, D.7).
#[derive(Debug, Default, PartialEq)]
struct GoogleDetails {
    /// `google.rpc.ErrorInfo.reason` (`API_KEY_INVALID`, `RATE_LIMIT_EXCEEDED`).
    reason: Option<String>,
    /// A `google.rpc.QuotaFailure` violation whose `quotaId` is per day:
    /// the wait runs to the daily reset, a quota rather than a rate limit.
    per_day: bool,
    /// `google.rpc.RetryInfo.retryDelay` (`"19s"`, `"3.700s"`).
    retry_delay: Option<Duration>,
}

impl GoogleDetails {
    fn parse(details: Option<&Value>) -> Self {
        let mut out = GoogleDetails::default();
        for d in details.and_then(Value::as_array).into_iter().flatten() {
            let ty = d.get("@type").and_then(Value::as_str).unwrap_or("");
            if ty.ends_with("google.rpc.ErrorInfo") {
                out.reason = str_field(d, "reason");
            } else if ty.ends_with("google.rpc.RetryInfo") {
                out.retry_delay = d
                    .get("retryDelay")
                    .and_then(Value::as_str)
                    .and_then(parse_proto_duration);
            } else if ty.ends_with("google.rpc.QuotaFailure") {
                let violations = d.get("violations").and_then(Value::as_array);
                out.per_day |= violations.into_iter().flatten().any(|v| {
                    v.get("quotaId")
                        .and_then(Value::as_str)
                        .is_some_and(|id| id.contains("PerDay"))
                });
            }
        }
        out
    }
}

/// A protobuf `Duration` in JSON (`"19s"`, `"3.700s"`); `None` unless positive.
fn parse_proto_duration(v: &str) -> Option<Duration> {
    positive_secs(v.trim().strip_suffix('s')?.parse().ok()?)
}

impl ErrorFields {
    /// Reads nested `{"error":{..}}`, Anthropic `{"type":"error","error":{..}}`,
    /// flat `{"object":"error",..}`, `{"error":"string"}` and a bare error object.
    fn parse(v: &Value) -> Self {
        match v.get("error") {
            Some(inner @ Value::Object(_)) => Self::from_object(inner),
            Some(Value::String(s)) => ErrorFields {
                message: Some(s.clone()),
                ..Self::from_object(v)
            },
            _ => Self::from_object(v),
        }
    }

    fn from_object(o: &Value) -> Self {
        let kind = str_field(o, "type").filter(|t| t != "error");
        ErrorFields {
            kind,
            code: o.get("code").and_then(scalar_string),
            message: str_field(o, "message"),
            detail_code: o.get("details").and_then(|d| str_field(d, "error_code")),
            status: str_field(o, "status"),
            google: GoogleDetails::parse(o.get("details")),
        }
    }

    /// An integer `code` in the HTTP status range (vLLM, llama.cpp).
    fn status_code(&self) -> Option<u16> {
        let n: u16 = self.code.as_deref()?.parse().ok()?;
        (100..600).contains(&n).then_some(n)
    }

    /// True if `type`, `code`, Google's `status` or `ErrorInfo.reason`
    /// matches one of `names` (see [`norm`]).
    fn is_any(&self, names: &[&str]) -> bool {
        [&self.kind, &self.code, &self.status, &self.google.reason]
            .into_iter()
            .flatten()
            .any(|s| names.contains(&norm(s).as_str()))
    }

    /// Short identifier for messages: `type` or `code`, sanitised.
    fn label(&self) -> String {
        let raw = self
            .kind
            .as_deref()
            .or(self.status.as_deref())
            .or(self.code.as_deref())
            .unwrap_or("");
        raw.chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            .take(64)
            .collect()
    }
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.as_str().map(str::to_owned)
}

fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Normalises an error type or code: lowercase, underscores and dashes removed,
/// so `InternalServerError`, `internal_server_error` and `server_error` compare easily.
fn norm(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Truncates to [`MAX_MESSAGE_CHARS`] and replaces control characters.
fn sanitise(msg: &str) -> String {
    let mut out: String = msg
        .chars()
        .take(MAX_MESSAGE_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if msg.chars().nth(MAX_MESSAGE_CHARS).is_some() {
        out.push('…');
    }
    out.trim().to_owned()
}

/// Class from the HTTP status alone (the body may refine it).
fn class_for_status(status: u16) -> OutcomeClass {
    match status {
        408 => OutcomeClass::Timeout,
        409 => OutcomeClass::ServerError,
        401 | 403 => OutcomeClass::Auth,
        402 => OutcomeClass::Quota,
        404 => OutcomeClass::NotFound,
        429 => OutcomeClass::RateLimited,
        400..=499 => OutcomeClass::Invalid,
        503 | 529 => OutcomeClass::Overloaded,
        500..=599 => OutcomeClass::ServerError,
        _ => OutcomeClass::Protocol,
    }
}

/// Class named by the error's type/code, if it names one.
fn class_for_names(f: &ErrorFields) -> Option<OutcomeClass> {
    // Google's names (`status`, `ErrorInfo.reason`) sit beside the others.
    let class = if f.detail_code.as_deref() == Some("enforced_spend_limit_reached")
        || f.google.per_day
        || f.is_any(&["insufficientquota", "billingerror"])
    {
        OutcomeClass::Quota
    } else if f.is_any(&[
        "ratelimitexceeded",
        "ratelimiterror",
        "ratelimit",
        "resourceexhausted",
    ]) {
        OutcomeClass::RateLimited
    } else if f.is_any(&[
        "overloadederror",
        "overloaded",
        "serviceunavailableerror",
        "unavailable",
    ]) {
        OutcomeClass::Overloaded
    } else if f.is_any(&[
        "authenticationerror",
        "permissionerror",
        "permissiondeniederror",
        "invalidapikey",
        "permissiondenied",
        "unauthenticated",
        "apikeyinvalid",
    ]) {
        OutcomeClass::Auth
    } else if f.is_any(&["notfounderror", "modelnotfound", "notfound"]) {
        OutcomeClass::NotFound
    } else if f.is_any(&[
        "invalidrequesterror",
        "badrequesterror",
        "exceedcontextsizeerror",
        "contextlengthexceeded",
        "unprocessableentityerror",
        "requesttoolarge",
        "invalidargument",
        "failedprecondition",
    ]) {
        OutcomeClass::Invalid
    } else if f.is_any(&[
        "servererror",
        "apierror",
        "internalservererror",
        "timeouterror",
        "internal",
        "deadlineexceeded",
    ]) {
        OutcomeClass::ServerError
    } else {
        return None;
    };
    Some(class)
}

/// A 429 split by body: quota, a request too large for this provider, or a rate limit.
fn refine_429(f: &ErrorFields) -> OutcomeClass {
    if is_quota(f) {
        OutcomeClass::Quota
    } else if is_too_large(f) {
        OutcomeClass::TooLarge
    } else {
        OutcomeClass::RateLimited
    }
}

fn is_quota(f: &ErrorFields) -> bool {
    class_for_names(f) == Some(OutcomeClass::Quota)
}

fn is_too_large(f: &ErrorFields) -> bool {
    f.message
        .as_deref()
        .is_some_and(|m| m.trim_start().starts_with("Request too large"))
}

/// The caller-safe message for a failure of `class`.
fn message_for(class: OutcomeClass, f: &ErrorFields, status: Option<u16>) -> String {
    let upstream = f.message.as_deref().map(sanitise).filter(|m| !m.is_empty());
    let status = status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    match class {
        OutcomeClass::Auth => AUTH_MESSAGE.to_owned(),
        OutcomeClass::Invalid | OutcomeClass::NotFound => {
            upstream.unwrap_or_else(|| format!("upstream rejected the request{status}"))
        }
        _ => {
            let label = f.label();
            if label.is_empty() {
                format!("upstream {class}{status}")
            } else {
                format!("upstream {class}{status}: {label}")
            }
        }
    }
}

/// Classifies a non-success HTTP response (status, headers and body as received).
pub fn classify_http(status: u16, headers: &HeaderMap, body: &[u8]) -> Failure {
    classify_http_at(status, headers, body, SystemTime::now())
}

/// [`classify_http`] with the clock injected (for HTTP-date `retry-after`).
pub fn classify_http_at(status: u16, headers: &HeaderMap, body: &[u8], now: SystemTime) -> Failure {
    let fields = serde_json::from_slice::<Value>(body)
        .map(|v| ErrorFields::parse(&v))
        .unwrap_or_default();
    let named = class_for_names(&fields);
    let class = match class_for_status(status) {
        OutcomeClass::RateLimited => refine_429(&fields),
        OutcomeClass::Invalid | OutcomeClass::NotFound if named == Some(OutcomeClass::Quota) => {
            OutcomeClass::Quota
        }
        OutcomeClass::ServerError if named == Some(OutcomeClass::Overloaded) => {
            OutcomeClass::Overloaded
        }
        // Google answers a bad API key with 400 `API_KEY_INVALID`.
        OutcomeClass::Invalid if named == Some(OutcomeClass::Auth) => OutcomeClass::Auth,
        c => c,
    };
    let header_retry = should_retry_header(headers);
    Failure {
        class,
        // Headers first, then Google's `RetryInfo` (reference D.5).
        retry_after: parse_retry_after(headers, now).or(fields.google.retry_delay),
        should_retry: header_retry.or((status == 408).then_some(true)),
        http_status: Some(status),
        upstream_request_id: request_id(headers),
        message: message_for(class, &fields, Some(status)),
    }
}

/// Classifies an error object found inside a response body (a mid-stream SSE
/// frame, a 200 JSON error, a llama.cpp `error:` field). `http_status` is the
/// response status (200 for in-stream errors).
pub fn classify_error_object(v: &Value, http_status: Option<u16>) -> Failure {
    let fields = ErrorFields::parse(v);
    let class = if is_too_large(&fields) && !is_quota(&fields) {
        OutcomeClass::TooLarge
    } else if let Some(c) = class_for_names(&fields) {
        c
    } else if let Some(code) = fields.status_code() {
        match class_for_status(code) {
            OutcomeClass::Protocol => OutcomeClass::ServerError,
            c => c,
        }
    } else {
        match http_status.filter(|s| *s >= 400) {
            Some(s) => class_for_status(s),
            None => OutcomeClass::ServerError,
        }
    };
    Failure {
        http_status,
        retry_after: fields.google.retry_delay,
        ..Failure::new(class, message_for(class, &fields, None))
    }
}

/// A failure found inside a 200 response body (a stream frame or a JSON body).
pub fn in_body(class: OutcomeClass, message: impl Into<String>) -> Failure {
    Failure {
        http_status: Some(200),
        ..Failure::new(class, message)
    }
}

/// Classifies a transport error (no response, or the body broke).
pub fn classify_transport(err: &super::client::Error) -> Failure {
    let (class, message) = if err.is_timeout() {
        (OutcomeClass::Timeout, "upstream timed out")
    } else if err.is_connect() {
        (OutcomeClass::Connect, "could not connect to upstream")
    } else if err.is_body() {
        (OutcomeClass::Truncated, "upstream body ended abnormally")
    } else {
        (OutcomeClass::Connect, "upstream connection failed")
    };
    Failure::new(class, message)
}

/// `x-should-retry: true|false` (Stainless SDK convention).
fn should_retry_header(headers: &HeaderMap) -> Option<bool> {
    match header_str(headers, "x-should-retry")?.trim() {
        v if v.eq_ignore_ascii_case("true") => Some(true),
        v if v.eq_ignore_ascii_case("false") => Some(false),
        _ => None,
    }
}

/// `x-request-id` (OpenAI) or `request-id` (Anthropic), if printable and short.
fn request_id(headers: &HeaderMap) -> Option<String> {
    let id = header_str(headers, "x-request-id").or_else(|| header_str(headers, "request-id"))?;
    let id = id.trim();
    (!id.is_empty() && id.len() <= 200).then(|| id.to_owned())
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok()
}

/// How long the upstream asked us to wait: `retry-after-ms` (float ms, also
/// Azure's `x-ms-retry-after-ms`), then `retry-after` as float seconds, then as
/// an IMF-fixdate relative to `now`. The first header holding a finite, positive
/// value wins; zero, negative, NaN, infinite, garbage or past values count as absent.
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let ms = ["retry-after-ms", "x-ms-retry-after-ms"]
        .into_iter()
        .filter_map(|h| header_str(headers, h))
        .find_map(|v| positive_secs(v.trim().parse::<f64>().ok()? / 1000.0));
    ms.or_else(|| {
        let v = header_str(headers, "retry-after")?.trim();
        match v.parse::<f64>() {
            Ok(secs) => positive_secs(secs),
            Err(_) => http_date_after(v, now),
        }
    })
}

fn positive_secs(secs: f64) -> Option<Duration> {
    if secs.is_finite() && secs > 0.0 {
        Duration::try_from_secs_f64(secs).ok()
    } else {
        None
    }
}

/// Time from `now` until an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`); `None` if past.
fn http_date_after(v: &str, now: SystemTime) -> Option<Duration> {
    let at = UNIX_EPOCH + Duration::from_secs(parse_imf_fixdate(v)?);
    at.duration_since(now).ok().filter(|d| !d.is_zero())
}

/// Parses an IMF-fixdate into seconds since the Unix epoch (the weekday is not checked).
fn parse_imf_fixdate(v: &str) -> Option<u64> {
    let (_weekday, rest) = v.split_once(", ")?;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u32 = parse_digits(day, 2)?;
    let month = month_number(month)?;
    let year: u32 = parse_digits(year, 4)?;
    let hms: Vec<&str> = time.split(':').collect();
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    let (h, m, s): (u32, u32, u32) = (
        parse_digits(h, 2)?,
        parse_digits(m, 2)?,
        parse_digits(s, 2)?,
    );
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 || year < 1970 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + u64::from(h * 3600 + m * 60 + s))
}

fn parse_digits(s: &str, len: usize) -> Option<u32> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

fn month_number(m: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let i = MONTHS.iter().position(|x| *x == m)?;
    u32::try_from(i + 1).ok()
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: u32, month: u32, day: u32) -> u64 {
    let y = u64::from(if month <= 2 { year - 1 } else { year });
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = u64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + u64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};
    use serde_json::json;

    /// 2026-01-01T00:00:00Z.
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_767_225_600)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// Response headers and the wait they should yield.
    type RetryCase<'a> = (&'a [(&'a str, &'a str)], Option<Duration>);

    #[test]
    fn retry_after_edge_values() {
        let cases: &[RetryCase] = &[
            (&[("retry-after", "0")], None),
            (&[("retry-after", "-1")], None),
            (&[("retry-after", "NaN")], None),
            (&[("retry-after", "nan")], None),
            (&[("retry-after", "inf")], None),
            (&[("retry-after", "-inf")], None),
            (&[("retry-after", "abc")], None),
            (&[("retry-after", "")], None),
            (&[("retry-after", "1e400")], None),
            (&[("retry-after", "2")], Some(Duration::from_secs(2))),
            (
                &[("retry-after", " 2.5 ")],
                Some(Duration::from_millis(2500)),
            ),
            (&[("retry-after", "Thu, 01 Jan 2026 00:00:00 GMT")], None),
            (&[("retry-after", "Wed, 31 Dec 2025 23:59:00 GMT")], None),
            (
                &[("retry-after", "Thu, 01 Jan 2026 00:01:30 GMT")],
                Some(Duration::from_secs(90)),
            ),
            (&[("retry-after", "Thu, 01 Jan 2026 00:01:30 UTC")], None),
            (&[("retry-after", "Thu, 32 Jan 2026 00:01:30 GMT")], None),
            (
                &[("retry-after-ms", "1500.5")],
                Some(Duration::from_micros(1_500_500)),
            ),
            (
                &[("retry-after-ms", "250"), ("retry-after", "5")],
                Some(Duration::from_millis(250)),
            ),
            (
                &[("retry-after", "5"), ("retry-after-ms", "250")],
                Some(Duration::from_millis(250)),
            ),
            (
                &[("retry-after-ms", "0"), ("retry-after", "5")],
                Some(Duration::from_secs(5)),
            ),
            (
                &[("retry-after-ms", "abc"), ("retry-after", "5")],
                Some(Duration::from_secs(5)),
            ),
            (&[("retry-after-ms", "-5")], None),
            (&[("retry-after-ms", "NaN")], None),
            (
                &[("x-ms-retry-after-ms", "100")],
                Some(Duration::from_millis(100)),
            ),
            (&[], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(
                parse_retry_after(&headers(pairs), now()),
                *want,
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn imf_fixdate_matches_known_epoch() {
        assert_eq!(
            parse_imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(parse_imf_fixdate("Sunday, 06-Nov-94 08:49:37 GMT"), None);
    }

    fn http(status: u16, body: &str) -> Failure {
        classify_http_at(status, &HeaderMap::new(), body.as_bytes(), now())
    }

    #[test]
    fn status_and_body_table() {
        let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let quota_code_only =
            r#"{"error":{"message":"x","type":"tokens","code":"insufficient_quota"}}"#;
        let rate = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
        let too_large = r#"{"error":{"message":"Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 34307.","type":"tokens","code":"rate_limit_exceeded"}}"#;
        let spend = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your API usage limits","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_1"}"#;
        let a_rate =
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
        let billing =
            r#"{"type":"error","error":{"type":"billing_error","message":"card declined"}}"#;
        let cases: &[(u16, &str, OutcomeClass)] = &[
            (503, "", OutcomeClass::Overloaded),
            (
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                OutcomeClass::Overloaded,
            ),
            (500, "", OutcomeClass::ServerError),
            (
                500,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
                OutcomeClass::Overloaded,
            ),
            (502, "<html>bad gateway</html>", OutcomeClass::ServerError),
            (504, "", OutcomeClass::ServerError),
            (599, "", OutcomeClass::ServerError),
            (408, "", OutcomeClass::Timeout),
            (409, "", OutcomeClass::ServerError),
            (429, quota, OutcomeClass::Quota),
            (429, quota_code_only, OutcomeClass::Quota),
            (429, spend, OutcomeClass::Quota),
            (429, too_large, OutcomeClass::TooLarge),
            (429, rate, OutcomeClass::RateLimited),
            (429, a_rate, OutcomeClass::RateLimited),
            (429, "", OutcomeClass::RateLimited),
            (429, "not json", OutcomeClass::RateLimited),
            (401, "", OutcomeClass::Auth),
            (403, "", OutcomeClass::Auth),
            (404, "", OutcomeClass::NotFound),
            (400, "", OutcomeClass::Invalid),
            (413, "", OutcomeClass::Invalid),
            (422, "", OutcomeClass::Invalid),
            (418, "", OutcomeClass::Invalid),
            (402, "", OutcomeClass::Quota),
            (400, billing, OutcomeClass::Quota),
            (302, "", OutcomeClass::Protocol),
        ];
        for (status, body, want) in cases {
            let f = http(*status, body);
            assert_eq!(f.class, *want, "{status} {body}");
            assert_eq!(f.http_status, Some(*status));
        }
    }

    #[test]
    fn auth_message_never_includes_the_body() {
        let body = r#"{"error":{"message":"Incorrect API key provided: sk-proj-SECRET","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        for status in [401, 403] {
            let f = http(status, body);
            assert_eq!(f.class, OutcomeClass::Auth);
            assert!(!f.message.contains("SECRET"), "{}", f.message);
            assert!(!f.message.contains("Incorrect"), "{}", f.message);
        }
    }

    #[test]
    fn invalid_message_is_the_sanitised_upstream_message() {
        let long = "x".repeat(1000);
        let body = json!({"error": {"message": format!("bad\nthing {long}"), "type": "invalid_request_error"}});
        let f = http(400, &body.to_string());
        assert!(f.message.starts_with("bad thing xxx"), "{}", f.message);
        assert!(f.message.chars().count() <= MAX_MESSAGE_CHARS + 1);
        let f = http(
            400,
            r#"{"error":{"message":"context_length_exceeded: too long"}}"#,
        );
        assert_eq!(f.message, "context_length_exceeded: too long");
    }

    #[test]
    fn headers_fill_retry_fields_and_request_id() {
        let h = headers(&[
            ("retry-after", "3"),
            ("x-should-retry", "false"),
            ("x-request-id", "req_abc"),
        ]);
        let f = classify_http_at(503, &h, b"", now());
        assert_eq!(f.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(f.should_retry, Some(false));
        assert!(!f.retry_same_target());
        assert_eq!(f.upstream_request_id.as_deref(), Some("req_abc"));

        let h = headers(&[("x-should-retry", "true"), ("request-id", "req_anth")]);
        let f = classify_http_at(400, &h, b"", now());
        assert_eq!(f.class, OutcomeClass::Invalid);
        assert!(f.retry_same_target());
        assert_eq!(f.upstream_request_id.as_deref(), Some("req_anth"));
    }

    #[test]
    fn http_408_is_retryable_unless_the_header_says_no() {
        assert!(http(408, "").retry_same_target());
        let h = headers(&[("x-should-retry", "false")]);
        let f = classify_http_at(408, &h, b"", now());
        assert!(!f.retry_same_target());
    }

    #[test]
    fn error_object_table() {
        let cases: &[(Value, OutcomeClass)] = &[
            (
                json!({"error":{"message":"boom","type":"server_error","param":null,"code":null}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"error":{"message":"boom","type":"InternalServerError","code":500}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"error":{"message":"boom","code":500}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"error":{"message":"boom","code":"500"}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"error":{"message":"bad","type":"BadRequestError","code":400}}),
                OutcomeClass::Invalid,
            ),
            (
                json!({"object":"error","message":"bad","type":"BadRequestError","code":400}),
                OutcomeClass::Invalid,
            ),
            (
                json!({"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}),
                OutcomeClass::Invalid,
            ),
            (
                json!({"error":{"code":400,"message":"x"}}),
                OutcomeClass::Invalid,
            ),
            (
                json!({"error":{"message":"x","type":"NotFoundError","code":404}}),
                OutcomeClass::NotFound,
            ),
            (
                json!({"error":{"message":"x","code":"rate_limit_exceeded","type":"tokens"}}),
                OutcomeClass::RateLimited,
            ),
            (
                json!({"error":{"message":"x","code":"insufficient_quota"}}),
                OutcomeClass::Quota,
            ),
            (
                json!({"error":"something broke"}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
                OutcomeClass::Overloaded,
            ),
            (
                json!({"type":"error","error":{"details":null,"type":"overloaded_error","message":"Overloaded"}}),
                OutcomeClass::Overloaded,
            ),
            (
                json!({"type":"error","error":{"type":"api_error","message":"x"}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"type":"error","error":{"type":"timeout_error","message":"x"}}),
                OutcomeClass::ServerError,
            ),
            (
                json!({"type":"error","error":{"type":"rate_limit_error","message":"x"}}),
                OutcomeClass::RateLimited,
            ),
            (
                json!({"type":"error","error":{"type":"rate_limit_error","message":"x","details":{"error_code":"enforced_spend_limit_reached"}}}),
                OutcomeClass::Quota,
            ),
            (
                json!({"type":"error","error":{"type":"authentication_error","message":"secret"}}),
                OutcomeClass::Auth,
            ),
            (
                json!({"type":"error","error":{"type":"something_new","message":"x"}}),
                OutcomeClass::ServerError,
            ),
            (json!({}), OutcomeClass::ServerError),
        ];
        for (v, want) in cases {
            let f = classify_error_object(v, Some(200));
            assert_eq!(f.class, *want, "{v}");
            assert_eq!(f.http_status, Some(200));
        }
    }

    #[test]
    fn error_object_without_names_falls_back_to_http_status() {
        let f = classify_error_object(&json!({"error":"nope"}), Some(404));
        assert_eq!(f.class, OutcomeClass::NotFound);
    }

    /// Google's error shape (reference D.5, D.7).
    fn google(code: u16, status: &str, details: Value) -> String {
        json!({"error": {"code": code, "message": "m", "status": status, "details": details}})
            .to_string()
    }

    fn quota(quota_id: &str, delay: &str) -> Value {
        json!([
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
                {"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                 "quotaId": quota_id, "quotaValue": "20"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
        ])
    }

    #[test]
    fn google_errors_are_classified_by_status_and_details() {
        let per_minute = google(
            429,
            "RESOURCE_EXHAUSTED",
            quota(
                "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "19s",
            ),
        );
        let per_day = google(
            429,
            "RESOURCE_EXHAUSTED",
            quota(
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                "3.700s",
            ),
        );
        let bad_key = google(
            400,
            "INVALID_ARGUMENT",
            json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]),
        );
        let none = json!([]);
        let cases: &[(u16, String, OutcomeClass, Option<Duration>)] = &[
            (
                429,
                per_minute.clone(),
                OutcomeClass::RateLimited,
                Some(Duration::from_secs(19)),
            ),
            (
                429,
                per_day.clone(),
                OutcomeClass::Quota,
                Some(Duration::from_millis(3700)),
            ),
            (
                503,
                google(503, "UNAVAILABLE", none.clone()),
                OutcomeClass::Overloaded,
                None,
            ),
            (
                500,
                google(500, "INTERNAL", none.clone()),
                OutcomeClass::ServerError,
                None,
            ),
            (
                504,
                google(504, "DEADLINE_EXCEEDED", none.clone()),
                OutcomeClass::ServerError,
                None,
            ),
            (
                400,
                google(400, "INVALID_ARGUMENT", none.clone()),
                OutcomeClass::Invalid,
                None,
            ),
            (
                400,
                google(400, "FAILED_PRECONDITION", none.clone()),
                OutcomeClass::Invalid,
                None,
            ),
            (400, bad_key, OutcomeClass::Auth, None),
            (
                403,
                google(403, "PERMISSION_DENIED", none.clone()),
                OutcomeClass::Auth,
                None,
            ),
            (
                401,
                google(401, "UNAUTHENTICATED", none.clone()),
                OutcomeClass::Auth,
                None,
            ),
            (
                404,
                google(404, "NOT_FOUND", none.clone()),
                OutcomeClass::NotFound,
                None,
            ),
        ];
        for (status, body, class, wait) in cases {
            let f = http(*status, body);
            assert_eq!(f.class, *class, "{status} {body}");
            assert_eq!(f.retry_after, *wait, "{status} {body}");
        }
        assert_eq!(
            http(429, &per_minute).message,
            "upstream rate_limited (HTTP 429): RESOURCE_EXHAUSTED"
        );
        // A header wins over RetryInfo.
        let h = headers(&[("retry-after", "2")]);
        let f = classify_http_at(429, &h, per_minute.as_bytes(), now());
        assert_eq!(f.retry_after, Some(Duration::from_secs(2)));
        // The same shapes inside a stream.
        let v: Value = serde_json::from_str(&per_minute).unwrap();
        let f = classify_error_object(&v, Some(200));
        assert_eq!(f.class, OutcomeClass::RateLimited);
        assert_eq!(f.retry_after, Some(Duration::from_secs(19)));
        let v: Value = serde_json::from_str(&google(503, "UNAVAILABLE", none)).unwrap();
        assert_eq!(
            classify_error_object(&v, Some(200)).class,
            OutcomeClass::Overloaded
        );
    }

    #[test]
    fn retry_delays_are_protobuf_durations() {
        assert_eq!(parse_proto_duration("19s"), Some(Duration::from_secs(19)));
        assert_eq!(
            parse_proto_duration("3.700s"),
            Some(Duration::from_millis(3700))
        );
        assert_eq!(parse_proto_duration("0s"), None);
        assert_eq!(parse_proto_duration("-1s"), None);
        assert_eq!(parse_proto_duration("19"), None);
        assert_eq!(parse_proto_duration("NaNs"), None);
    }

    #[tokio::test]
    async fn transport_connect_refused_is_connect() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = crate::upstream::client::Client::with_proxies(Default::default(), None)
            .post(
                &format!("http://{addr}/"),
                Default::default(),
                Default::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(classify_transport(&err).class, OutcomeClass::Connect);
    }
}
