//! The job vocabulary every layer speaks: a job's state and its record, as
//! plain data. Below the event sink (which carries a job accepted for a
//! request to its caller) and the job store (`state::jobs`, which keeps
//! records and re-exports these), so neither reaches up for the other.

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Expired,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "QUEUED",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Expired => "EXPIRED",
        }
    }

    /// The state a store wrote with `as_str` (an unknown one reads as QUEUED).
    pub fn parse(s: &str) -> JobState {
        match s {
            "RUNNING" => JobState::Running,
            "SUCCEEDED" => JobState::Succeeded,
            "FAILED" => JobState::Failed,
            "EXPIRED" => JobState::Expired,
            _ => JobState::Queued,
        }
    }

    /// No further change will happen.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Expired
        )
    }
}

/// One job as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub tenant: String,
    pub route: String,
    /// The encoded `CompletionRequest`.
    pub request: Vec<u8>,
    pub state: JobState,
    pub attempts: u32,
    /// The encoded `CompletionResponse`, once succeeded.
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub error_reason: Option<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Claim token of the run holding it (RUNNING only).
    pub claim: Option<String>,
}
