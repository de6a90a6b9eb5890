#!/usr/bin/env bash
# What a running daemon adds to every system call of the machine.
#
# usage: scripts/syscall-tax.sh WARMSTART [COPIES=1000000] [ROUNDS=5]
#
# Each round times `dd bs=1 count=COPIES` from /dev/zero to /dev/null (two
# system calls a byte) with no daemon (A) and with `WARMSTART daemon`
# running on a fresh state directory (B), in alternating order (AB, BA,
# ...). The daemon's policy learns nothing here (`learn = "allow-list"`
# naming no program there is): it sees dd's exec and lets it go, as it
# does every program it is not learning or auditing. Prints nanoseconds per system call for
# each run and the median over rounds of what the daemon added. Needs
# root.
set -euo pipefail
ws=${1:?usage: $0 WARMSTART [COPIES] [ROUNDS]}
copies=${2:-1000000}
rounds=${3:-5}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ws-tax.XXXXXX)
. "$(dirname "$0")/daemon-lib.sh"
trap 'stop_daemon; rm -rf "$work"' EXIT
printf 'learn = "allow-list"\nallow = ["%s/none"]\n' "$work" >"$work/config.toml"

# Nanoseconds per system call of one dd run.
copy() {
	local t0 t1
	t0=$(date +%s%N)
	dd if=/dev/zero of=/dev/null bs=1 count="$copies" 2>/dev/null
	t1=$(date +%s%N)
	echo $(((t1 - t0) / (2 * copies)))
}

added=()
for ((r = 0; r < rounds; r++)); do
	if ((r % 2 == 0)); then order="A B"; else order="B A"; fi
	for side in $order; do
		if [ "$side" = B ]; then
			start_daemon "$work/config.toml"
			b=$(copy)
			stop_daemon
		else
			a=$(copy)
		fi
	done
	added+=("$((b - a))")
	echo "round $r: no daemon $a ns/syscall, daemon $b ns/syscall, added $((b - a)) ns"
done
printf '%s\n' "${added[@]}" | sort -n | awk '{v[NR]=$1} END {printf "median added by the daemon: %d ns per system call over %d rounds\n", v[int((NR+1)/2)], NR}'
