#!/usr/bin/env bash
# Pull-request check for RayService manifests: says (or fails) when a change
# makes KubeRay build a second RayCluster that requests GPUs, i.e. an upgrade
# that needs the GPUs of both clusters at once and that raygate will hold
# until they are free; and fails when the manifest sets spec.upgradeStrategy,
# the field raygate owns (docs/gitops.md).
#
#   raygate-pr-check.sh BASE.yaml HEAD.yaml            # warn (exit 0)
#   RAYGATE_CHECK=fail raygate-pr-check.sh BASE HEAD   # exit 1 on such a change
#   RAYGATE_STATE=state.yaml ...                       # also `raygate fit` against a
#       cluster state (`kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml`): exit 3 if it
#       does not fit now
#
# Exit codes (distinct, so CI can tell a finding from a broken check):
#   0  no new GPU cluster, or only warned (RAYGATE_CHECK=warn)
#   1  the change builds a second GPU cluster (RAYGATE_CHECK=fail)
#   2  invalid input or usage: a file raygate cannot read (the message names
#      the file and field), a missing argument, raygate or jq not found
#   3  the new cluster does not fit the cluster state now (RAYGATE_STATE)
#   4  HEAD.yaml sets spec.upgradeStrategy: with a GitOps tool applying it, it
#      overrides raygate's gate (whatever RAYGATE_CHECK says)
#
# Needs `raygate` (RAYGATE=/path/to/raygate) and `jq`. Prints one line a GitHub
# Actions log turns into an annotation (::warning:: / ::error::).
set -euo pipefail

usage="usage: raygate-pr-check.sh BASE.yaml HEAD.yaml"
if [ $# -ne 2 ]; then
  echo "::error::$usage" >&2
  exit 2
fi
base=$1
head=$2
raygate=${RAYGATE:-raygate}
mode=${RAYGATE_CHECK:-warn}
kuberay=${RAYGATE_KUBERAY_VERSION:-1.7}
name=$(basename "$head")

case $mode in
  warn | fail) ;;
  *)
    echo "::error::RAYGATE_CHECK=$mode: expected warn or fail" >&2
    exit 2
    ;;
esac
for tool in "$raygate" jq; do
  if ! command -v "$tool" >/dev/null; then
    echo "::error::$tool not found (set RAYGATE=/path/to/raygate)" >&2
    exit 2
  fi
done

stderr=$(mktemp)
trap 'rm -f "$stderr"' EXIT
# raygate: exit 1 invalid input, 2 usage; its stderr names the file and field.
if ! out=$("$raygate" explain --old "$base" --new "$head" --kuberay-version "$kuberay" -o json 2>"$stderr"); then
  echo "::error::$name: raygate explain could not check it: $(cat "$stderr")"
  exit 2
fi
verdict=$(jq -r '.verdict' <<<"$out")
gpus=$(jq -r '.newCluster.requests["nvidia.com/gpu"] // "0"' <<<"$out")
paths=$(jq -r '.triggeringPaths | join(", ")' <<<"$out")

errors=$(jq -r '(.errors // [])[] | "\(.path): \(.message)"' <<<"$out")
if [ -n "$errors" ]; then
  while IFS= read -r e; do
    echo "::error::$name: $e"
  done <<<"$errors"
  exit 4
fi

if [ "$verdict" != "NewCluster" ] || [ "$gpus" = "0" ]; then
  echo "raygate: $name: $verdict, no new GPU cluster ($(jq -r '.reason' <<<"$out"))"
  exit 0
fi

msg="$name: this change builds a second RayCluster requesting nvidia.com/gpu=$gpus next to the running one (changed: $paths). raygate holds it until both clusters fit. If only Serve settings change, put them in serveConfigV2 instead."
if [ -n "${RAYGATE_STATE:-}" ]; then
  fit=("$raygate" fit --state "$RAYGATE_STATE" --old "$base" --new "$head" --kuberay-version "$kuberay")
  if fitted=$("${fit[@]}" --fail-if-no-fit -o json 2>"$stderr"); then
    msg="$msg It fits in the cluster now."
  else
    rc=$?
    if [ "$rc" != 3 ]; then
      echo "::error::$name: raygate fit could not check it: $(cat "$stderr")"
      exit 2
    fi
    echo "::error::$msg It does NOT fit in the cluster now: $(jq -c '.shortfall // .' <<<"$fitted")"
    exit 3
  fi
fi
if [ "$mode" = fail ]; then
  echo "::error::$msg"
  exit 1
fi
echo "::warning::$msg"
