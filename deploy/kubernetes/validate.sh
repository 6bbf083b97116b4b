#!/usr/bin/env bash
# Renders the kustomize base offline and validates every object against the
# Kubernetes OpenAPI schemas, strictly: unknown or mistyped fields fail.
#
#   deploy/kubernetes/validate.sh            # Kubernetes 1.32.0
#   K8S_VERSION=1.33.0 deploy/kubernetes/validate.sh
#
# Needs a renderer (`kustomize`, or `kubectl`: Debian's kubernetes-client
# package has one) and `kubernetes-validate` (pip install -r
# deploy/kubernetes/requirements.txt). Exit codes: 0 valid, 1 invalid,
# 3 a tool is missing.
set -euo pipefail

dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="${K8S_VERSION:-1.32.0}"

missing() {
    echo "validate.sh: MISSING TOOL: $1" >&2
    exit 3
}

if command -v kustomize >/dev/null 2>&1; then
    render=(kustomize build "$dir")
elif command -v kubectl >/dev/null 2>&1; then
    render=(kubectl kustomize "$dir")
else
    missing "kustomize or kubectl (apt-get install kubernetes-client)"
fi
command -v kubernetes-validate >/dev/null 2>&1 ||
    missing "kubernetes-validate (pip install -r deploy/kubernetes/requirements.txt)"

rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
"${render[@]}" >"$rendered"

objects="$(grep -c '^kind:' "$rendered" || true)"
if [ "$objects" -eq 0 ]; then
    echo "validate.sh: ${render[*]} rendered no objects" >&2
    exit 1
fi

echo "validate.sh: ${render[*]} -> $objects objects; kubernetes-validate --strict -k $version" >&2
# kubernetes-validate exits 0 with only a WARN for a kind or apiVersion it has
# no schema for (a typo such as autoscaling/v9): demand that every object passed.
status=0
report="$(kubernetes-validate --strict -k "$version" - <"$rendered" 2>&1)" || status=$?
printf '%s\n' "$report" | grep -v '^INFO' >&2 || true
passed="$(printf '%s\n' "$report" | grep -c 'passed for resource' || true)"
if [ "$status" -ne 0 ] || [ "$passed" -ne "$objects" ]; then
    echo "validate.sh: INVALID: $passed of $objects objects passed (kubernetes-validate exit $status)" >&2
    exit 1
fi
echo "validate.sh: ok ($objects objects valid for Kubernetes $version)"
