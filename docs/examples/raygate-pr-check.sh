#!/usr/bin/env bash
# Pull-request check for RayService manifests: says (or fails) when a change
# makes KubeRay build a second RayCluster that requests GPUs, i.e. an upgrade
# that needs the GPUs of both clusters at once and that raygate will hold
# until they are free.
#
#   raygate-pr-check.sh BASE.yaml HEAD.yaml            # warn (exit 0)
#   RAYGATE_CHECK=fail raygate-pr-check.sh BASE HEAD   # exit 1 on such a change
#   RAYGATE_STATE=state.yaml ...                       # also `raygate fit` against a
#       cluster state (`kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml`): exit 3 if it
#       does not fit now
#
# Needs `raygate` (RAYGATE=/path/to/raygate) and `jq`. Prints one line a GitHub
# Actions log turns into an annotation (::warning:: / ::error::).
set -euo pipefail

base=${1:?usage: raygate-pr-check.sh BASE.yaml HEAD.yaml}
head=${2:?usage: raygate-pr-check.sh BASE.yaml HEAD.yaml}
raygate=${RAYGATE:-raygate}
mode=${RAYGATE_CHECK:-warn}
kuberay=${RAYGATE_KUBERAY_VERSION:-1.7}

out=$("$raygate" explain --old "$base" --new "$head" --kuberay-version "$kuberay" -o json)
verdict=$(jq -r '.verdict' <<<"$out")
gpus=$(jq -r '.newCluster.requests["nvidia.com/gpu"] // "0"' <<<"$out")
paths=$(jq -r '.triggeringPaths | join(", ")' <<<"$out")
name=$(basename "$head")

if [ "$verdict" != "NewCluster" ] || [ "$gpus" = "0" ]; then
  echo "raygate: $name: $verdict, no new GPU cluster ($(jq -r '.reason' <<<"$out"))"
  exit 0
fi

msg="$name: this change builds a second RayCluster requesting nvidia.com/gpu=$gpus next to the running one (changed: $paths). raygate holds it until both clusters fit. If only Serve settings change, put them in serveConfigV2 instead."
if [ -n "${RAYGATE_STATE:-}" ]; then
  if "$raygate" fit --state "$RAYGATE_STATE" --new "$head" --kuberay-version "$kuberay" --fail-if-no-fit >/dev/null; then
    msg="$msg It fits in the cluster now."
  else
    rc=$?
    [ "$rc" = 3 ] || exit "$rc"
    echo "::error::$msg It does NOT fit in the cluster now: $("$raygate" fit --state "$RAYGATE_STATE" --new "$head" --kuberay-version "$kuberay" -o json | jq -c '.shortfall // .')"
    exit 3
  fi
fi
if [ "$mode" = fail ]; then
  echo "::error::$msg"
  exit 1
fi
echo "::warning::$msg"
