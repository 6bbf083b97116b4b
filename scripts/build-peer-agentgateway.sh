#!/usr/bin/env bash
# Builds agentgateway (https://github.com/agentgateway/agentgateway, Rust,
# Apache-2.0), the Rust peer of `switchyard bench --scenario peers --peer-bin`,
# from a source checkout into a scratch folder OUTSIDE the repository:
#   $SWITCHYARD_PEERS_DIR (default $HOME/.cache/switchyard-peers)
#     agentgateway/agentgateway   the binary (pass it as --peer-bin)
#     agentgateway/revision.txt   git revision, toolchain, profile, build time
#
#   scripts/build-peer-agentgateway.sh SRC_DIR [REVISION]
#
# SRC_DIR is a checkout (or `git archive` export) of agentgateway; REVISION is
# recorded in revision.txt (default: `git -C SRC_DIR rev-parse HEAD`, if it is a
# work tree). The bench never builds the peer; it only runs --peer-bin.
#
# What the build needs, read from agentgateway's Cargo workspace and Makefile:
# - no protoc: crates/protos compiles its .proto files with protox (pure Rust);
# - no npm: the admin UI is the `ui` feature, off by default (not built here);
# - a C compiler and make (aws-lc-sys, jemalloc); no cmake, no clang;
# - four crates patched to forks on github.com/gitlab.com ([patch.crates-io]:
#   schemars, http-serde, wiremock, async-openai). Where only crates.io is
#   reachable (PATCH_GIT_FORKS=1, the default) this script EDITS SRC_DIR's
#   Cargo.toml to use the crates.io releases of the same versions instead
#   (async-openai =0.41.1, schemars =1.2.1, http-serde 2.1, wiremock 0.6), and
#   lets cargo re-resolve only those entries of Cargo.lock (the schemars fork's
#   `arcstr1` and the wiremock fork's `tls` features are dropped: only the
#   optional `schema` feature and tests use them). PATCH_GIT_FORKS=0 builds
#   the tree as is (needs github.com and gitlab.com).
#   CAVEAT (measured at 75b4e6ce6, 2026-08-21): schemars, http-serde and
#   wiremock resolve, but the async-openai fork (howardjohn/async-openai
#   @681e3c6) carries API that no crates.io release has (prompt-cache
#   breakpoints, programmatic tool calling, Reasoning.mode, ...): agent-llm
#   fails with 62 errors against 0.41.1 and 32 against 0.43.0
#   (ASYNC_OPENAI_VERSION selects the release). So without github.com this
#   script does NOT produce a binary at that revision.
# - its rust-toolchain.toml pins a toolchain (1.98 at the measured revision);
#   RUST_TOOLCHAIN overrides it (default: the pinned one if rustup has it,
#   else `stable`). The workspace's rust-version (MSRV) is older.
#
# PROFILE (default quick-release): agentgateway's own "release optimized"
# profile (opt-level 3, codegen-units 16, no LTO), i.e. the same code
# generation settings as Switchyard's release build. PROFILE=release is its
# shipping profile (fat LTO, codegen-units 1): a much longer build.
# Features: the defaults of agentgateway-app (jemalloc, mimalloc,
# crypto-aws-lc), as its Makefile's `build` target.
#
# CARGO_TARGET_DIR is honoured (default SRC_DIR/target). To keep a big build
# from slowing other work, run it at idle priority, e.g.
#   chrt --idle 0 nice -n 19 scripts/build-peer-agentgateway.sh /path/to/src
set -euo pipefail

SRC="${1:?usage: build-peer-agentgateway.sh SRC_DIR [REVISION]}"
SRC="$(cd "$SRC" && pwd)"
REV="${2:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}"
DIR="${SWITCHYARD_PEERS_DIR:-$HOME/.cache/switchyard-peers}"
PROFILE="${PROFILE:-quick-release}"
PATCH_GIT_FORKS="${PATCH_GIT_FORKS:-1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SRC/target}"

cd "$SRC"
[ -f crates/agentgateway-app/Cargo.toml ] || { echo "build-peer-agentgateway: $SRC is not an agentgateway checkout" >&2; exit 2; }

# Toolchain: the pinned channel if installed, else stable.
pinned="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml 2>/dev/null || true)"
if [ -z "${RUST_TOOLCHAIN:-}" ]; then
  if [ -n "$pinned" ] && rustup toolchain list 2>/dev/null | grep -q "^$pinned"; then
    RUST_TOOLCHAIN="$pinned"
  else
    RUST_TOOLCHAIN=stable
  fi
fi
export RUSTUP_TOOLCHAIN="$RUST_TOOLCHAIN"
echo "build-peer-agentgateway: toolchain $RUSTUP_TOOLCHAIN ($(rustc --version)), pinned ${pinned:-none}, profile $PROFILE" >&2

if [ "$PATCH_GIT_FORKS" = 1 ] && grep -q '^\[patch.crates-io\]' Cargo.toml; then
  echo "build-peer-agentgateway: replacing the git forks of [patch.crates-io] with crates.io releases" >&2
  # Drop the [patch.crates-io] table (it is the first table, ends at a blank line).
  awk 'BEGIN{skip=0} /^\[patch.crates-io\]/{skip=1; next} skip && /^\[/{skip=0} !skip' Cargo.toml > Cargo.toml.new
  # The workspace's schemars entry also names the fork.
  sed -i -E 's#^(schemars = \{ version = "=1\.2\.1"), git = "[^"]*", rev = "[^"]*"#\1#' Cargo.toml.new
  # The fork adds schemars' `arcstr1` feature (arcstr impls); crates.io lacks
  # it. schemars is only used by the optional `schema` feature (JSON schema
  # generation, xtask), which this build does not enable.
  awk '/^schemars = \{/{s=1} s && /"arcstr1",/{next} s && /\] \}/{s=0} {print}' Cargo.toml.new > Cargo.toml.new2
  mv Cargo.toml.new2 Cargo.toml.new
  # The wiremock fork adds a `tls` feature; wiremock is a dev-dependency only.
  sed -i -E 's#^wiremock = \{ version = "0\.6", features = \["tls"\] \}#wiremock = "0.6"#' Cargo.toml.new
  sed -i -E "s#^(async-openai = \\{ version = )\"0\\.41\"#\\1\"=${ASYNC_OPENAI_VERSION:-0.41.1}\"#" Cargo.toml.new
  mv Cargo.toml.new Cargo.toml
  if grep -q 'git = "https://git' Cargo.toml; then
    echo "build-peer-agentgateway: a git dependency is left in Cargo.toml:" >&2
    grep -n 'git = "https://git' Cargo.toml >&2
    exit 1
  fi
  # The lock names the forks as sources; resolving again (without --locked)
  # replaces just those entries and keeps every other locked version.
  cargo metadata --format-version 1 >/dev/null
fi

start=$(date +%s)
cargo build --profile "$PROFILE" -p agentgateway-app --bin agentgateway >&2
secs=$(( $(date +%s) - start ))

mkdir -p "$DIR/agentgateway"
cp "$CARGO_TARGET_DIR/$PROFILE/agentgateway" "$DIR/agentgateway/agentgateway"
{
  echo "agentgateway=$REV"
  echo "toolchain=$(rustc --version)"
  echo "profile=$PROFILE"
  echo "patched_git_forks=$PATCH_GIT_FORKS"
  echo "build_seconds=$secs"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$DIR/agentgateway/revision.txt"
echo "build-peer-agentgateway: $DIR/agentgateway/agentgateway ($secs s)" >&2
echo "$DIR/agentgateway/agentgateway"
