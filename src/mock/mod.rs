//! (in progress) mock-upstream.
