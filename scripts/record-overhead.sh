#!/usr/bin/env bash
# Recording overhead: a cold launch recorded by `warmstart record` vs the
# same cold launch unrecorded, interleaved, medians over ROUNDS rounds.
# Usage: scripts/record-overhead.sh [CMD ARGS...]   (root; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
WS=$PWD/target/release/warmstart
ROUNDS=${ROUNDS:-7}
if [ $# -gt 0 ]; then APP=("$@"); else APP=(/usr/bin/python3 -c 'import asyncio, email.mime.multipart, json, decimal, sqlite3'); fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s%N; }
declare -a P R
for r in $(seq 1 "$ROUNDS"); do
  cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); P+=($(( (t1 - t0) / 1000 )))
  cold; t0=$(now); "$WS" record -q -o "$out/t.trace" -- "${APP[@]}" >/dev/null; t1=$(now); R+=($(( (t1 - t0) / 1000 )))
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mp=$(median "${P[@]}"); mr=$(median "${R[@]}")
awk -v p="$mp" -v r="$mr" -v n="$ROUNDS" -v cmd="${APP[*]}" 'BEGIN {
  printf "%s\n  cold unrecorded  %8.1f ms (median of %d)\n  cold recorded    %8.1f ms\n  overhead         %+7.1f%%\n", cmd, p/1000, n, r/1000, 100*(r-p)/p }'
