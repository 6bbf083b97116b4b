#!/usr/bin/env bash
# Builds Busbar (https://github.com/GetBusbar/busbar, Rust, Apache-2.0), the
# fallback Rust peer of `switchyard bench --scenario peers --peer-bin`, from a
# source checkout into a scratch folder OUTSIDE the repository:
#   $SWITCHYARD_PEERS_DIR (default $HOME/.cache/switchyard-peers)
#     busbar/busbar         the binary (pass it as --peer-bin; the bench tells
#                           Busbar from agentgateway by the file name)
#     busbar/revision.txt   git revision, toolchain, profile, build time
#
#   scripts/build-peer-busbar.sh SRC_DIR [REVISION]
#
# Busbar needs no protoc, npm or git dependencies; it requires rustc 1.97+
# (RUST_TOOLCHAIN, default 1.97: `rustup toolchain install 1.97` first).
# Its shipping release profile is fat LTO + codegen-units 1; by default
# (BUSBAR_SHIPPING_PROFILE=0) this builds `release` with LTO off and 16
# codegen units, i.e. the code generation settings of Switchyard's release
# build (and a much shorter build). Default features (auth-admin-tokens,
# hooks-ranking). CARGO_TARGET_DIR is honoured (default SRC_DIR/target); run
# it at idle priority to spare other work: chrt --idle 0 nice -n 19 ...
set -euo pipefail

SRC="${1:?usage: build-peer-busbar.sh SRC_DIR [REVISION]}"
SRC="$(cd "$SRC" && pwd)"
REV="${2:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}"
DIR="${SWITCHYARD_PEERS_DIR:-$HOME/.cache/switchyard-peers}"
export RUSTUP_TOOLCHAIN="${RUST_TOOLCHAIN:-1.97}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SRC/target}"
profile="release (lto=false, codegen-units=16)"
if [ "${BUSBAR_SHIPPING_PROFILE:-0}" != 1 ]; then
  export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
else
  profile="release (shipping: fat LTO, codegen-units=1)"
fi
cd "$SRC"
[ -f crates/busbar/Cargo.toml ] || { echo "build-peer-busbar: $SRC is not a Busbar checkout" >&2; exit 2; }
echo "build-peer-busbar: $(rustc --version), $profile" >&2
start=$(date +%s)
cargo build --release -p busbar --bin busbar >&2
secs=$(( $(date +%s) - start ))
mkdir -p "$DIR/busbar"
cp "$CARGO_TARGET_DIR/release/busbar" "$DIR/busbar/busbar"
{
  echo "busbar=$REV"
  echo "toolchain=$(rustc --version)"
  echo "profile=$profile"
  echo "build_seconds=$secs"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$DIR/busbar/revision.txt"
echo "build-peer-busbar: $DIR/busbar/busbar ($secs s)" >&2
echo "$DIR/busbar/busbar"
