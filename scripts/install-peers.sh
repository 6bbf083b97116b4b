#!/usr/bin/env bash
# Installs the peers of `switchyard bench --scenario peers` into a scratch
# folder OUTSIDE the repository (never committed):
#   $SWITCHYARD_PEERS_DIR (default $HOME/.cache/switchyard-peers)
#     litellm/venv            Python venv with litellm[proxy]
#     portkey/node_modules    npm install @portkey-ai/gateway
#     versions.txt            `litellm=X` and `portkey=Y`, read by the bench
# Versions are pinned below (litellm 1.108+ needs litellm-proxy-extras builds the
# registry may lack); override with LITELLM_VERSION / PORTKEY_VERSION
# (empty = latest). Idempotent: an installed peer is kept.
#
# Portkey fix (scratch copy only, PORTKEY_PATCH=1, the default): Portkey's
# streaming answers fail under Node with `TypeError: immutable` (known upstream,
# Portkey-AI/gateway#1389: ResponseService.updateHeaders appends to the headers
# of a fetch() Response, which are immutable). Pinning @hono/node-server 1.14.2,
# the workaround suggested there, did not help with gateway 1.15.2 here, so the
# built start-server.js is patched to hand updateHeaders a copy with mutable
# headers: `r = new Response(r.body, {status, statusText, headers: new Headers(r.headers)})`.
# PORTKEY_PATCH=0 leaves it unpatched (the bench then measures the failures).
# The result (patched / unpatched) is recorded in versions.txt.
set -euo pipefail

DIR="${SWITCHYARD_PEERS_DIR:-$HOME/.cache/switchyard-peers}"
LITELLM_VERSION="${LITELLM_VERSION-1.100.5}"
PORTKEY_VERSION="${PORTKEY_VERSION-1.15.2}"
PORTKEY_PATCH="${PORTKEY_PATCH-1}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR/litellm" "$DIR/portkey"
status=0

# --- LiteLLM proxy (PyPI) ----------------------------------------------------
lit_spec="litellm[proxy]"
[ -n "$LITELLM_VERSION" ] && lit_spec="litellm[proxy]==$LITELLM_VERSION"
if [ ! -x "$DIR/litellm/venv/bin/litellm" ]; then
  echo "install-peers: $lit_spec into $DIR/litellm/venv" >&2
  if "$PYTHON" -m venv "$DIR/litellm/venv" \
     && "$DIR/litellm/venv/bin/pip" install --quiet --disable-pip-version-check "$lit_spec"; then
    :
  else
    echo "install-peers: LiteLLM install FAILED" >&2
    status=1
  fi
fi
lit_v="$("$DIR/litellm/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))' 2>/dev/null || echo none)"

# --- Portkey gateway (npm) ---------------------------------------------------
pk_spec="@portkey-ai/gateway"
[ -n "$PORTKEY_VERSION" ] && pk_spec="@portkey-ai/gateway@$PORTKEY_VERSION"
if [ ! -f "$DIR/portkey/node_modules/@portkey-ai/gateway/package.json" ]; then
  echo "install-peers: npm install $pk_spec into $DIR/portkey" >&2
  rm -rf "$DIR/portkey/node_modules" "$DIR/portkey/package-lock.json"
  echo '{"name":"switchyard-peers","private":true}' > "$DIR/portkey/package.json"
  if ! (cd "$DIR/portkey" && npm install --no-audit --no-fund --loglevel=error "$pk_spec" >&2); then
    echo "install-peers: Portkey install FAILED" >&2
    status=1
  fi
fi
js="$DIR/portkey/node_modules/@portkey-ai/gateway/build/start-server.js"
pk_patch=unpatched
if [ -f "$js" ]; then
  [ -f "$js.orig" ] || cp "$js" "$js.orig"
  if [ "$PORTKEY_PATCH" = 1 ]; then
    sed -E 's/this\.updateHeaders\(([A-Za-z_$][A-Za-z0-9_$]*),/\1=new Response(\1.body,{status:\1.status,statusText:\1.statusText,headers:new Headers(\1.headers)}),this.updateHeaders(\1,/' \
      "$js.orig" > "$js"
    if cmp -s "$js" "$js.orig"; then
      echo "install-peers: Portkey patch did not apply (left unpatched)" >&2
    else
      pk_patch="patched (updateHeaders gets a Response copy with mutable headers)"
    fi
  else
    cp "$js.orig" "$js"
  fi
fi
pk_v="$(node -p 'require(process.argv[1]).version' "$DIR/portkey/node_modules/@portkey-ai/gateway/package.json" 2>/dev/null || echo none)"

printf 'litellm=%s\nportkey=%s\nportkey_streaming_fix=%s\nnode=%s\npython=%s\n' "$lit_v" "$pk_v" "$pk_patch" \
  "$(node --version 2>/dev/null || echo none)" "$("$PYTHON" --version 2>&1 | awk '{print $2}')" \
  > "$DIR/versions.txt"
cat "$DIR/versions.txt"
exit $status
