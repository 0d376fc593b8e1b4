#!/usr/bin/env bash
# Runs a CHE grid as N processes sharing one machine (one GPU, or many CPU cores), then
# assembles it: every shard runs eval/che_sweep.py with the same flags and --shard=I/N
# (bipe_jax/che/sweep.py says how the pairs are split), logging to LOG_DIR/shard_I.log; the
# last run, without --shard, writes results.json, table.md and the PNGs (or, where a shard
# failed, trains its missing cells itself).
#
#   eval/che_sweep_shards.sh 15 --tasks=... --encodings=... --output_dir=che_grid_out
#
# Environment: PYTHON (default python), LOG_DIR (default OUTPUT_DIR/logs), ASSEMBLE=0 to skip
# the last run (e.g. under a time limit: rerun this script, or che_sweep.py, to finish).
set -uo pipefail
if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N [eval/che_sweep.py flags...]  (N processes, N >= 1)" >&2
  exit 2
fi
n=$1; shift
py=${PYTHON:-python}
out=che_out
for a in "$@"; do [[ $a == --output_dir=* ]] && out=${a#--output_dir=}; done
cd "$(dirname "$0")/.." || exit 2
logs=${LOG_DIR:-$out/logs}
mkdir -p "$logs"
pids=()
for ((i = 0; i < n; i++)); do
  "$py" eval/che_sweep.py "$@" --shard="$i/$n" >"$logs/shard_$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < n; i++)); do
  wait "${pids[$i]}" || { echo "shard $i/$n failed: $logs/shard_$i.log" >&2; failed=1; }
done
[[ ${ASSEMBLE:-1} == 0 ]] && exit $failed
exec "$py" eval/che_sweep.py "$@"
