#!/usr/bin/env bash
# make demo: warmstart learning a real program's launch, then the cold /
# warm / warmstart launch times measured in the same run, interleaved.
# Usage: scripts/demo.sh [CMD ARGS...]   (default: a Python program; ROUNDS=N)
set -euo pipefail
cd "$(dirname "$0")/.."
# The static binary `make release` builds, else a plain `cargo build --release`.
WS=${WS:-$PWD/target/$(rustc -vV | sed -n "s/^host: //p")/release/warmstart}
[ -x "$WS" ] || WS=$PWD/target/release/warmstart
# Cold launches here vary by tens of ms, so the share of the gap moves a
# lot from run to run: 43-71% in four 9-round runs with one plan (23 Nov).
# Nine rounds rather than five narrow that a little.
ROUNDS=${ROUNDS:-9}
if [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; else PY=$(command -v python3); fi
if [ $# -gt 0 ]; then APP=("$@"); else
APP=("$PY" -c 'import asyncio, email.mime.multipart, json, decimal, sqlite3, http.client, xml.dom.minidom, argparse, logging, unittest'); fi
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT

if [ "$(id -u)" != 0 ]; then echo "make demo needs root (BPF, drop_caches)"; exit 1; fi
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000 )) ; }   # microseconds

echo "== warmstart demo: ${APP[*]}"
echo "-- learning: two launches recorded, then a plan is compiled"
cold; "$WS" run -v --state-dir "$state" -- "${APP[@]}" >/dev/null
"$WS" run -v --state-dir "$state" -- "${APP[@]}" >/dev/null
"$WS" status --state-dir "$state"
echo
echo "-- measuring $ROUNDS interleaved rounds of cold / warm / warmstart"
declare -a C W S O D
# Warm launches are cheap and vary from one to the next by more than
# warmstart's cost on them, so each round times WARM pairs of them.
WARM=${WARM:-4}
for r in $(seq 1 "$ROUNDS"); do
  cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); C+=("$(ms "$t0" "$t1")")
  # A warm launch is warm for warmstart too: its own binary was dropped
  # with the caches above and would otherwise be timed loading from disk.
  "$WS" --version >/dev/null
  for _ in $(seq 1 "$WARM"); do
    t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); w=$(ms "$t0" "$t1"); W+=("$w")
    t0=$(now); "$WS" run -q --state-dir "$state" -- "${APP[@]}" >/dev/null; t1=$(now); o=$(ms "$t0" "$t1"); O+=("$o")
    D+=($((o - w)))
  done
  cold; t0=$(now); "$WS" run -q --state-dir "$state" -- "${APP[@]}" >/dev/null; t1=$(now); S+=("$(ms "$t0" "$t1")")
  printf '\r   round %d/%d' "$r" "$ROUNDS"
done
echo
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mc=$(median "${C[@]}"); mw=$(median "${W[@]}"); msw=$(median "${S[@]}"); mo=$(median "${O[@]}"); md=$(median "${D[@]}")
awk -v c="$mc" -v w="$mw" -v s="$msw" -v o="$mo" -v d="$md" 'BEGIN {
  printf "\n%-22s %12s %10s\n", "scenario", "median ms", "vs cold";
  printf "%-22s %12.1f %10.2f\n", "cold", c/1000, 1;
  printf "%-22s %12.1f %10.2f\n", "warm", w/1000, w/c;
  printf "%-22s %12.1f %10.2f\n", "warmstart (cold)", s/1000, s/c;
  printf "%-22s %12.1f %10.2f\n", "warmstart (warm)", o/1000, o/c;
  if (c > w) printf "\nwarmstart captured %.0f%% of the cold-warm gap; on a warm launch it costs %+.1f ms (median of the paired differences;\nwarm launches alone vary by tens of ms here: scripts/warm-overhead.py measures that cost over hundreds of launches)\n", 100*(c-s)/(c-w), d/1000;
}'
"$WS" status --state-dir "$state"
