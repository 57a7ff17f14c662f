# shellcheck shell=bash
# The demo's env file: `./e2e/demo --keep` leaves the cluster running and says
# `source DIR/env`; that must also put `kubectl raygate` (the kubectl-raygate
# plugin) and `raygate` on PATH, or the README's commands are not found.
#
# Usage: demo_env_add_bins ENV_FILE BIN_DIR
demo_env_add_bins() {
  local env_file=$1 bin_dir=$2
  [[ -f $env_file ]] || { echo "demo_env_add_bins: no $env_file" >&2; return 1; }
  [[ -x $bin_dir/kubectl-raygate ]] || { echo "demo_env_add_bins: no $bin_dir/kubectl-raygate" >&2; return 1; }
  grep -qF "# raygate binaries (e2e/demo)" "$env_file" && return 0
  printf "export PATH='%s':\"\$PATH\"  # raygate binaries (e2e/demo): kubectl raygate, raygate\n" "$bin_dir" >>"$env_file"
}
