#!/usr/bin/env bash
# Recording overhead: the same cold launch unrecorded, recorded by
# `warmstart record` (a wrapper that loads the BPF recorder first), and
# recorded by a running `warmstart daemon` (recorder already loaded: the
# daemon's learning launches). Interleaved, caches dropped before each,
# medians over ROUNDS rounds.
# Usage: scripts/record-overhead.sh [CMD ARGS...]   (root; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
# The static binary `make release` builds, else a plain `cargo build --release`.
WS=${WS:-$PWD/target/$(rustc -vV | sed -n "s/^host: //p")/release/warmstart}
[ -x "$WS" ] || WS=$PWD/target/release/warmstart
ROUNDS=${ROUNDS:-7}
if [ $# -gt 0 ]; then APP=("$@"); else APP=(/usr/bin/python3 -c 'import asyncio, email.mime.multipart, json, decimal, sqlite3'); fi
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 1; }
work=$(mktemp -d); dpid=
trap '[ -n "$dpid" ] && kill "$dpid" 2>/dev/null; rm -rf "$work"' EXIT
exe=$(readlink -f "$(command -v "${APP[0]}")")
printf 'learn = "allow-list"\nallow = ["%s"]\nskip_services = false\nidle_s = 1.0\n' "$exe" > "$work/config.toml"
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s%N; }
declare -a P R D
traced=0
for r in $(seq 1 "$ROUNDS"); do
  cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); P+=($(( (t1 - t0) / 1000 )))
  cold; t0=$(now); "$WS" record -q -o "$work/t.trace" -- "${APP[@]}" >/dev/null; t1=$(now); R+=($(( (t1 - t0) / 1000 )))
  # A fresh daemon each round, so the launch is a learning (recorded) one.
  rm -rf "$work/dstate"
  "$WS" daemon --config "$work/config.toml" --state-dir "$work/dstate" --socket "$work/sock" 2>>"$work/daemon.log" & dpid=$!
  for _ in $(seq 200); do [ -S "$work/sock" ] && break; sleep 0.05; done
  cold; t0=$(now); "${APP[@]}" >/dev/null; t1=$(now); D+=($(( (t1 - t0) / 1000 )))
  for _ in $(seq 100); do compgen -G "$work/dstate/profiles/*/trace-0" >/dev/null && break; sleep 0.1; done
  compgen -G "$work/dstate/profiles/*/trace-0" >/dev/null && traced=$((traced + 1))
  kill "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=; rm -f "$work/sock"
  printf '\r  round %d/%d' "$r" "$ROUNDS" >&2
done
echo >&2
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mp=$(median "${P[@]}"); mr=$(median "${R[@]}"); md=$(median "${D[@]}")
awk -v p="$mp" -v r="$mr" -v d="$md" -v n="$ROUNDS" -v t="$traced" -v cmd="${APP[*]}" 'BEGIN {
  printf "%s (medians of %d)\n", cmd, n
  printf "  cold unrecorded             %8.1f ms\n", p/1000
  printf "  cold, warmstart record      %8.1f ms  %+6.1f%%\n", r/1000, 100*(r-p)/p
  printf "  cold, recorded by daemon    %8.1f ms  %+6.1f%%  (%d of %d launches traced)\n", d/1000, 100*(d-p)/p, t, n }'
