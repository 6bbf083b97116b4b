//! The fleet backend on Redis (placeholder until it lands).
