# shellcheck shell=bash
# The cargo target directory of a checkout, for every script that builds or runs its binaries.
# Usage: cargo_target_dir CHECKOUT   (prints it; $CARGO_TARGET_DIR wins when set)
#
# One directory per checkout path, under $RAYGATE_CACHE (default ~/.cache/raygate): cargo reuses a workspace crate
# built in another checkout at another path (it checks the files that build recorded, and
# env!("CARGO_MANIFEST_DIR") is baked into the e2e crate), so two clones sharing one target
# directory run each other's code. A CI machine that clones to the same path keeps its cache.
cargo_target_dir() {
  if [[ -n ${CARGO_TARGET_DIR:-} ]]; then
    printf '%s' "$CARGO_TARGET_DIR"
    return
  fi
  local key
  key=$(printf '%s' "$1" | sha256sum | cut -c1-12)
  printf '%s' "${RAYGATE_CACHE:-$HOME/.cache/raygate}/target-$key"
}

# Marks the target directory as used now and removes those of checkouts unused for 14 days
# (a few GB each), and the directory shared by all checkouts before 2026-12-03.
cargo_target_housekeeping() { # $1 the target dir in use
  mkdir -p "$1"
  touch "$1/.raygate-last-used"
  local d cache=${RAYGATE_CACHE:-$HOME/.cache/raygate}
  for d in "$cache"/target-*; do
    [[ -d $d && $d != "$1" && -f $d/.raygate-last-used ]] || continue
    if [[ -n $(find "$d/.raygate-last-used" -mtime +14 2>/dev/null) ]]; then
      rm -rf -- "$d"
    fi
  done
  if [[ -d $cache/target/debug && $1 != "$cache/target" ]]; then
    rm -rf -- "$cache/target"
  fi
}
