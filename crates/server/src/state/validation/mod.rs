//! Golden-set validation records as the server holds them: the record type
//! ([`record`]: per route, each target's verdict) and its store ([`store`]:
//! the admin API's writes and the shared record file, published to the
//! router actor). The runner that produces records is `switchyard golden`
//! (crates/golden); the server only keeps and obeys them.

pub mod record;
pub mod store;
