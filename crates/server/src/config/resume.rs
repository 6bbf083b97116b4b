//! `[resume]`: how long a streamed completion's journal is kept for a
//! resume and how many bytes it may hold (one stream, and every stream of
//! the process with the embedded backend). Pure data; `validate.rs` checks it.

use std::time::Duration;

use serde::Deserialize;

/// `[resume]`: the resume journal's lifetime and bounds. Past a byte bound a
/// stream is marked not resumable (`Finished.resumable = false`), never
/// truncated silently.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResumeConfig {
    /// Journal streamed answers (true). `false` streams without a journal:
    /// no resume, `Finished.resumable = false` (the bench's baseline).
    pub enabled: bool,
    /// A journal is kept this long after its last write.
    #[serde(with = "crate::config::duration")]
    pub ttl: Duration,
    /// Bytes of encoded events one stream's journal may hold.
    pub max_bytes_per_stream: usize,
    /// Bytes every journal of the process holds together (embedded backend;
    /// Redis is bounded by its `maxmemory`).
    pub max_total_bytes: usize,
    /// Streams this replica journals at once; a stream that starts beyond
    /// it is not journaled (`resumable = false`), so the journal's writes
    /// never crowd out the state every request needs (Redis).
    pub max_streams: usize,
}

/// The default of `resume.max_total_bytes`: 64 MiB, the same budget as the
/// response cache and the idempotency records.
pub const DEFAULT_MAX_TOTAL_BYTES: usize = 64 * 1024 * 1024;

impl Default for ResumeConfig {
    fn default() -> Self {
        ResumeConfig {
            enabled: true,
            ttl: Duration::from_secs(600),
            max_bytes_per_stream: 1_048_576,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_streams: DEFAULT_MAX_STREAMS,
        }
    }
}

/// The default of `resume.max_streams`.
pub const DEFAULT_MAX_STREAMS: usize = 128;
/// The largest `resume.max_streams`.
pub const MAX_STREAMS: usize = 100_000;

/// The longest `resume.ttl`: a day (a journal is a stream's recovery, not an archive).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The largest `resume.max_bytes_per_stream`: 64 MiB (far past any one
/// answer's events; a larger bound is a typo).
pub const MAX_BYTES_PER_STREAM: usize = 64 * 1024 * 1024;
/// The largest `resume.max_total_bytes`: 16 GiB of process memory.
pub const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024 * 1024;
/// The smallest byte bound: one event of a real stream fits.
pub const MIN_BYTES: usize = 1024;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};

    const BASE: &str = r#"
[[providers]]
id = "p"
kind = "openai"
base_url = "http://127.0.0.1:8001/v1"
  [[providers.models]]
  name = "m"
[[routes]]
name = "chat"
targets = ["p/m"]
"#;

    fn with(resume: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(&format!("{BASE}\n[resume]\n{resume}\n"))
    }

    #[test]
    fn resume_defaults_are_the_contract() {
        let c = Config::from_toml_str(BASE).unwrap();
        assert_eq!(c.resume.ttl, Duration::from_secs(600));
        assert_eq!(c.resume.max_bytes_per_stream, 1_048_576);
        assert_eq!(c.resume.max_total_bytes, 64 * 1024 * 1024);
        let c = with("ttl = \"10m\"\nmax_bytes_per_stream = 1048576\nmax_total_bytes = 2097152")
            .unwrap();
        assert_eq!(c.resume.ttl, Duration::from_secs(600));
        assert_eq!(c.resume.max_total_bytes, 2_097_152);
    }

    #[test]
    fn resume_zero_or_absurd_values_are_refused_with_their_key() {
        for (text, path) in [
            ("ttl = \"0s\"", "resume.ttl"),
            ("ttl = \"2d\"", "resume.ttl"),
            ("max_streams = 0", "resume.max_streams"),
            ("max_streams = 100001", "resume.max_streams"),
            ("max_bytes_per_stream = 0", "resume.max_bytes_per_stream"),
            (
                "max_bytes_per_stream = 68157440",
                "resume.max_bytes_per_stream",
            ),
            ("max_total_bytes = 0", "resume.max_total_bytes"),
            ("max_total_bytes = 17179869185", "resume.max_total_bytes"),
            // Below one stream's bound: the largest journal could never be kept.
            ("max_total_bytes = 4096", "resume.max_total_bytes"),
        ] {
            let e = with(text).unwrap_err();
            assert_eq!(e.path, path, "{text}: {e}");
        }
        let e = with("max_bytes = 1").unwrap_err();
        assert!(e.to_string().contains("max_bytes"), "{e}");
    }
}
