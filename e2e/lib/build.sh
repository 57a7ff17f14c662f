# shellcheck shell=bash
# raygate e2e: build (or reuse) the pinned upstream programs from the Go modules in e2e/tools.
# Sourced by e2e/control-plane. Needs: PROG, SCRIPT_DIR, CACHE_ROOT, log(), die().
#
# Each module e2e/tools/<tool> builds into
#   $CACHE_ROOT/bin/<tool>-<version>-<sha256(go.mod + go.sum), 12 hex>/
# in a temporary directory renamed into place when complete; the build log is kept in
# $CACHE_ROOT/logs/. A cache entry is reused whenever all its binaries are present.

GO_MIN_MAJOR=1
GO_MIN_MINOR=26
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
KUBERAY_VERSIONS=(v1.6.2 v1.5.2)
KARPENTER_VERSION=v1.15.0
# Karpenter's go.mod needs go >= 1.26.9 (newer than the machine's 1.26.8); go1.27.3, the approved newer toolchain, is fetched through the Go module proxy
# (golang.org/toolchain) into the module cache and used for that one module only.
KARPENTER_GOTOOLCHAIN=go1.27.3
# Traefik: the gateway controller of 'up --incremental'. v3.6.12 is the newest v3 release that
# builds as a dependency: v3.7.x requires github.com/traefik/traefik/dynamic/ext, a module it
# replaces with a directory of its own repository (not in its module zip, not served).
TRAEFIK_VERSION=v3.6.12
# Kueue: the quota engine of 'up --kueue' (its manager; its CRDs and webhook paths come from the
# same module zip in the module cache, see kueue_module_dir).
KUEUE_VERSION=v0.19.0
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
TOOLS=(kubernetes etcd kwok "${KUBERAY_VERSIONS[@]/#/kuberay-}" karpenter traefik kueue)

go_env() { # the Go environment of every build (CONTEXT: pinned, offline-capable module cache)
  env GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" GOTOOLCHAIN="${GO_TOOLCHAIN:-local}" \
    GOFLAGS=-mod=readonly CGO_ENABLED=0 "$@"
}

check_go() { # go present and >= 1.26
  command -v go >/dev/null ||
    die "'go' not found on PATH; install Go >= $GO_MIN_MAJOR.$GO_MIN_MINOR (e.g. /usr/local/go/bin) and retry"
  local v major minor
  v=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null) || die "'go env GOVERSION' failed ($(command -v go))"
  [[ $v =~ ^go([0-9]+)\.([0-9]+) ]] || die "cannot parse Go version '$v' of $(command -v go)"
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
  if ((major < GO_MIN_MAJOR || (major == GO_MIN_MAJOR && minor < GO_MIN_MINOR))); then
    die "$(command -v go) is $v; the e2e tools need Go >= $GO_MIN_MAJOR.$GO_MIN_MINOR (set PATH to a newer go)"
  fi
}

tool_version() { # $1 tool
  case $1 in
    kubernetes) echo "$K8S_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    kuberay-*) echo "${1#kuberay-}" ;;
    karpenter) echo "$KARPENTER_VERSION" ;;
    traefik) echo "$TRAEFIK_VERSION" ;;
    kueue) echo "$KUEUE_VERSION" ;;
    *) die "unknown tool '$1'" ;;
  esac
}

tool_bins() { # $1 tool -> binary names
  case $1 in
    kubernetes) echo "${K8S_BINS[*]}" ;;
    etcd) echo etcd ;;
    kwok) echo kwok ;;
    kuberay-*) echo ray-operator ;;
    karpenter) echo karpenter ;;
    traefik) echo traefik ;;
    kueue) echo kueue ;;
  esac
}

tool_moddir() { echo "$SCRIPT_DIR/tools/$1"; }

tool_toolchain() { # $1 tool -> the GOTOOLCHAIN its build uses
  case $1 in
    karpenter) echo "$KARPENTER_GOTOOLCHAIN" ;;
    *) echo local ;;
  esac
}

tool_dir() { # $1 tool -> cache dir (need not exist)
  local mod sha
  mod=$(tool_moddir "$1")
  [[ -f $mod/go.mod && -f $mod/go.sum ]] || die "missing $mod/go.mod or go.sum"
  sha=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
  # kuberay-v1.6.1 -> kuberay-v1.6.1-<sha>; kubernetes -> kubernetes-v1.36.3-<sha>
  echo "$CACHE_ROOT/bin/${1%-v*}-$(tool_version "$1")-$sha"
}

tool_complete() { # $1 dir, $2.. bins
  local d=$1 b
  shift
  for b in "$@"; do [[ -x $d/$b ]] || return 1; done
  [[ -f $d/BUILD-INFO ]]
}

# Runs the go build of one tool into $2 (a fresh dir). stdout/stderr: the build log.
go_build_tool() { # $1 tool, $2 out dir
  local tool=$1 out=$2 mod
  mod=$(tool_moddir "$tool")
  cd "$mod"
  case $tool in
    kubernetes)
      # What hack/lib/version.sh stamps, so `kubectl version` and /version say v1.36.3.
      local v=$K8S_VERSION ld="" p
      local minor=${v#v*.}
      minor=${minor%%.*}
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $p.gitVersion=$v -X $p.gitMajor=${v:1:1} -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
      done
      go_env go build -ldflags "$ld" -o "$out/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
      ;;
    etcd)
      go_env go build -o "$out/etcd" go.etcd.io/etcd/server/v3
      ;;
    kwok)
      go_env go build -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok
      ;;
    kuberay-*)
      # main.go has no version variables; the version is utils.KUBERAY_VERSION of the module.
      go_env go build -o "$out/ray-operator" github.com/ray-project/kuberay/ray-operator
      ;;
    karpenter)
      # Karpenter's kwok provider: the real controllers (provisioning, disruption, the
      # CapacityBuffer controller behind FEATURE_GATES), nodes created as kwok Nodes.
      go_env go build -o "$out/karpenter" sigs.k8s.io/karpenter/kwok
      ;;
    traefik)
      # What Traefik's release build stamps (its Makefile), so its log and /api/version say
      # v3.6.12. -s -w: no symbol table or DWARF (245 MB -> about 170 MB, a faster link).
      go_env go build -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=$TRAEFIK_VERSION" \
        -o "$out/traefik" github.com/traefik/traefik/v3/cmd/traefik
      ;;
    kueue)
      # The Kueue manager: all its controllers and webhooks (RayService, RayCluster, Workload,
      # ClusterQueue...) in one binary. -s -w: a faster link on the shared 2-core machine.
      go_env go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
        -o "$out/kueue" sigs.k8s.io/kueue/cmd/kueue
      ;;
  esac
}

kueue_module_dir() { # the module cache directory of sigs.k8s.io/kueue@$KUEUE_VERSION (CRDs, webhooks)
  local mod
  mod=$(tool_moddir kueue)
  (cd "$mod" && go_env go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | jq -r .Dir)
}

# build_tool TOOL QUIET: sets TOOL_DIR. Runs in the calling shell so INT/TERM reach its trap.
TOOL_DIR=""
build_tool() {
  local tool=$1 quiet=${2:-0} dir key bins
  dir=$(tool_dir "$tool")
  key=$(basename "$dir")
  read -r -a bins <<<"$(tool_bins "$tool")"
  if tool_complete "$dir" "${bins[@]}"; then TOOL_DIR=$dir; return 0; fi
  check_go
  mkdir -p "$CACHE_ROOT/bin" "$CACHE_ROOT/logs"
  # One build per tool at a time (parallel 'up's wait here instead of all building).
  exec 8>"$CACHE_ROOT/bin/.$key.lock"
  if ! flock -n 8; then
    log "another build of $key is running; waiting for it"
    flock 8
  fi
  if tool_complete "$dir" "${bins[@]}"; then exec 8>&-; TOOL_DIR=$dir; return 0; fi
  rm -rf "$CACHE_ROOT/bin/.tmp-$key".*
  local work buildlog t0=$SECONDS brc=0 bpid
  work=$(mktemp -d "$CACHE_ROOT/bin/.tmp-$key.XXXXXX")
  buildlog="$CACHE_ROOT/logs/build-$key-$(date +%Y%m%dT%H%M%S).log"
  ((quiet)) || log "building $key (log: $buildlog)"
  (
    set -euo pipefail
    exec </dev/null >"$buildlog" 2>&1
    GO_TOOLCHAIN=$(tool_toolchain "$tool")
    echo "== raygate build $key at $(date -u +%FT%TZ): $(go_env go version)"
    go_build_tool "$tool" "$work"
    {
      echo "tool=$tool"
      echo "version=$(tool_version "$tool")"
      echo "module=$(tool_moddir "$tool")"
      echo "go=$(go_env go version)"
      echo "built=$(date -u +%FT%TZ)"
      # The module of each binary's main package, as the binary records it.
      local b
      for b in $(tool_bins "$tool"); do
        go version -m "$work/$b" | awk -v b="$b" '$1 == "mod" {print "upstream_" b "=" $2 "@" $3; exit}'
      done
    } >"$work/BUILD-INFO"
  ) &
  bpid=$!
  # shellcheck disable=SC2064  # expand now: this build's pid and paths
  trap "log 'build of $key interrupted; stopping it'; kill_tree $bpid; wait $bpid; rm -rf '$work'; exit 130" INT TERM
  wait "$bpid" || brc=$?
  trap - INT TERM
  if ((brc != 0)); then
    rm -rf "$work"
    exec 8>&-
    log "build of $key FAILED after $((SECONDS - t0)) s; last lines of $buildlog:"
    tail -n 40 "$buildlog" >&2 || true
    die "building $key failed (full log: $buildlog)"
  fi
  tool_complete "$work" "${bins[@]}" || die "build of $key produced no ${bins[*]} (log: $buildlog)"
  rm -rf "$dir.old"
  [[ -e $dir ]] && mv -T "$dir" "$dir.old"
  mv -T "$work" "$dir"
  rm -rf "$dir.old"
  exec 8>&-
  ((quiet)) || log "built $key in $((SECONDS - t0)) s"
  TOOL_DIR=$dir
}

kill_tree() { # $1 pid: SIGTERM it and all its descendants (found via /proc)
  local pid=$1 f line rest ppid kids=()
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    rest=${line##*) }
    read -r _ ppid _ <<<"$rest"
    [[ $ppid == "$pid" ]] && kids+=("${f//[^0-9]/}")
  done
  kill -STOP "$pid" 2>/dev/null || true
  for f in "${kids[@]}"; do kill_tree "$f"; done
  kill -TERM "$pid" 2>/dev/null || true
  kill -CONT "$pid" 2>/dev/null || true
}
