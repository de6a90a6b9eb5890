#!/usr/bin/env bash
# Daemon-mode launch times: the same program launched cold with no
# prefetcher, warm, cold through `warmstart run`, and cold with
# `warmstart daemon` running (no wrapper), interleaved; medians.
# Usage: scripts/daemon-bench.sh CMD ARGS...   (root; release build; ROUNDS=N)
set -euo pipefail
cd "$(dirname "$0")/.."
# The static binary `make release` builds, else a plain `cargo build --release`.
WS=${WS:-$PWD/target/$(rustc -vV | sed -n "s/^host: //p")/release/warmstart}
[ -x "$WS" ] || WS=$PWD/target/release/warmstart
ROUNDS=${ROUNDS:-7}
APP=("$@")
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 1; }
work=$(mktemp -d); trap 'kill "$dpid" 2>/dev/null || true; rm -rf "$work"' EXIT
dpid=
exe=$(readlink -f "$(command -v "${APP[0]}")")
printf 'learn = "allow-list"\nallow = ["%s"]\nskip_services = false\n' "$exe" > "$work/config.toml"
daemon_start() { "$WS" daemon --config "$work/config.toml" --state-dir "$work/dstate" --socket "$work/sock" 2>>"$work/daemon.log" & dpid=$!;
  for _ in $(seq 100); do [ -S "$work/sock" ] && return; sleep 0.05; done; echo "daemon did not start"; cat "$work/daemon.log"; exit 1; }
daemon_stop() { kill "$dpid"; wait "$dpid" 2>/dev/null || true; rm -f "$work/sock"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s%N; }
# Learning: two launches each way.
for _ in 1 2; do "$WS" run -q --state-dir "$work/rstate" -- "${APP[@]}" >/dev/null; done
daemon_start; for _ in 1 2; do "${APP[@]}" >/dev/null; sleep 2.5; done; daemon_stop
declare -a C W R D
for r in $(seq 1 "$ROUNDS"); do
  cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); C+=($(( (t1-t0)/1000 )))
  t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); W+=($(( (t1-t0)/1000 )))
  cold; t0=$(now); "$WS" run -q --state-dir "$work/rstate" -- "${APP[@]}" >/dev/null; t1=$(now); R+=($(( (t1-t0)/1000 )))
  daemon_start; cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); D+=($(( (t1-t0)/1000 ))); sleep 1; daemon_stop
  printf '\r  round %d/%d' "$r" "$ROUNDS" >&2
done
echo >&2
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
awk -v c="$(median "${C[@]}")" -v w="$(median "${W[@]}")" -v r="$(median "${R[@]}")" -v d="$(median "${D[@]}")" -v cmd="${APP[*]}" 'BEGIN {
  printf "%s (medians of '"$ROUNDS"')\n", cmd;
  printf "  cold %.1f ms, warm %.1f ms, warmstart run %.1f ms (gap %.0f%%), daemon %.1f ms (gap %.0f%%)\n",
    c/1000, w/1000, r/1000, 100*(c-r)/(c-w), d/1000, 100*(c-d)/(c-w) }'
grep -h "Prefetching ->" "$work/daemon.log" | tail -2
