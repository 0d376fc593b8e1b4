#!/usr/bin/env bash
# Runs a CHE grid as N processes sharing one machine (one GPU, or many CPU cores), then
# assembles it: every process runs eval/che_sweep.py with the same flags and one --queue_dir,
# taking the next (task, encoding) pair nobody has claimed (bipe_jax/che/sweep.py), logging to
# LOG_DIR/worker_I.log; the last run, without the queue, writes results.json, table.md and the
# PNGs (or, where a process failed, trains its missing cells itself).
#
#   eval/che_sweep_shards.sh 15 --tasks=... --encodings=... --output_dir=che_grid_out
#
# A queue, not a fixed split: the DAPE, FIRE and CoPE cells cost up to ten times a RoPE cell on
# the CPU, and a fixed split leaves processes idle while one works through them.
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
queue=$(mktemp -d "${TMPDIR:-/tmp}/che_queue.XXXXXX") || exit 2
trap 'rm -rf "$queue"' EXIT
pids=()
for ((i = 0; i < n; i++)); do
  "$py" eval/che_sweep.py "$@" --queue_dir="$queue" >"$logs/worker_$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < n; i++)); do
  wait "${pids[$i]}" || { echo "process $i/$n failed: $logs/worker_$i.log" >&2; failed=1; }
done
[[ ${ASSEMBLE:-1} == 0 ]] && exit $failed
"$py" eval/che_sweep.py "$@"
