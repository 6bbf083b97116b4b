//! The listeners' connection caps fitted to the open-file limit, so no
//! listener can take the descriptors another needs: a reserve for the
//! process itself and its upstream calls comes first, then the admin
//! listener's own share (probes are always answered), and what is left is
//! shared by the gRPC listener and the HTTP doors in proportion to their
//! configured caps. With the usual limits (the hard limit is raised to at
//! start) nothing changes; under a low one the caps shrink and a WARN says so.

/// Open files kept for the process's own use (listeners, logs, the queue
/// file, Redis, the runtime), before one per upstream permit.
pub const BASE_RESERVE: u64 = 64;

/// The admin listener keeps at least this many connections when the limit
/// is low (and at most an eighth of the room for connections).
pub const ADMIN_FLOOR: usize = 4;

/// Connection caps, per listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub grpc: usize,
    /// 0 when the HTTP doors are off.
    pub http: usize,
    pub admin: usize,
}

impl Caps {
    /// These caps within `limit` open files, of which `BASE_RESERVE +
    /// upstream` (at most half) stay for everything but client connections.
    pub fn fit(self, limit: u64, upstream: u64) -> Caps {
        let reserve = BASE_RESERVE.saturating_add(upstream).min(limit / 2);
        let room = usize::try_from(limit - reserve).unwrap_or(usize::MAX);
        let admin = self.admin.min((room / 8).max(ADMIN_FLOOR));
        let clients = room.saturating_sub(admin);
        let wanted = self.grpc.saturating_add(self.http);
        if wanted <= clients {
            return Caps { admin, ..self };
        }
        let share = |n: usize| ((clients as u128 * n as u128) / wanted as u128) as usize;
        let http = if self.http == 0 {
            0
        } else {
            share(self.http).max(1)
        };
        Caps {
            grpc: clients.saturating_sub(http).max(1),
            http,
            admin,
        }
    }
}

/// The process's open-file limit (soft), when it has one.
pub fn open_file_limit() -> Option<u64> {
    let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).ok()?;
    (soft != rlimit::INFINITY).then_some(soft)
}

/// `configured` fitted to this process's open-file limit, with a WARN when
/// that lowered any cap.
pub fn fit_to_this_process(configured: Caps, upstream: u64) -> Caps {
    let Some(limit) = open_file_limit() else {
        return configured;
    };
    let caps = configured.fit(limit, upstream);
    if caps != configured {
        tracing::warn!(
            open_file_limit = limit,
            grpc = caps.grpc,
            http = caps.http,
            admin = caps.admin,
            "the open-file limit is below what the connection caps need: caps lowered so every listener keeps its share (raise the hard limit to restore server.*max_connections)"
        );
    }
    caps
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const DEFAULTS: Caps = Caps {
        grpc: 4096,
        http: 1024,
        admin: 64,
    };

    #[test]
    fn a_roomy_limit_changes_nothing() {
        assert_eq!(DEFAULTS.fit(1 << 20, 128), DEFAULTS);
        assert_eq!(DEFAULTS.fit(5120 + 64 + 64 + 128, 128), DEFAULTS);
    }

    #[test]
    fn a_low_limit_keeps_the_reserve_and_the_admin_share_and_splits_the_rest() {
        // 256 files, two providers of 64 permits: 128 kept (half the limit),
        // admin 16 (an eighth of the 128 left), 112 split 4096:1024.
        assert_eq!(
            DEFAULTS.fit(256, 128),
            Caps {
                grpc: 90,
                http: 22,
                admin: 16
            }
        );
        // 1024 files: 192 kept, admin keeps its 64, 768 split.
        assert_eq!(
            DEFAULTS.fit(1024, 128),
            Caps {
                grpc: 615,
                http: 153,
                admin: 64
            }
        );
        // Without the HTTP doors gRPC takes it all.
        let no_http = Caps {
            http: 0,
            ..DEFAULTS
        };
        assert_eq!(
            no_http.fit(1024, 128),
            Caps {
                grpc: 768,
                http: 0,
                admin: 64
            }
        );
    }

    #[test]
    fn every_listener_keeps_a_place_whatever_the_limit() {
        for limit in [0, 1, 8, 20, 64, 100] {
            let caps = DEFAULTS.fit(limit, 10_000);
            assert!(
                caps.grpc >= 1 && caps.http >= 1 && caps.admin >= 1,
                "{limit}: {caps:?}"
            );
        }
        // A small configured admin cap is never raised.
        let small = Caps {
            admin: 2,
            ..DEFAULTS
        };
        assert_eq!(small.fit(256, 128).admin, 2);
    }
}
