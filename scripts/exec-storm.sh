#!/usr/bin/env bash
# What the daemon costs a storm of short execs, and its memory after one.
#
# usage: scripts/exec-storm.sh WARMSTART [EXECS=5000] [ROUNDS=5] [VARIED=100000]
#
# Each round times EXECS runs of /bin/true from this shell with no daemon
# (A) and with `WARMSTART daemon` running on a fresh state directory with
# the default policy (B), in alternating order (AB, BA, ...). The shell is
# started before the daemon, so the daemon sees each /bin/true as a launch
# of its own, as it would a build system's children. Prints microseconds
# per exec for each run, the median of B/A over rounds, then runs VARIED
# execs of ten different small programs with the daemon and prints its
# resident memory before and after. Needs root.
set -euo pipefail
ws=${1:?usage: $0 WARMSTART [EXECS] [ROUNDS] [VARIED]}
execs=${2:-5000}
rounds=${3:-5}
varied=${4:-100000}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ws-storm.XXXXXX)
. "$(dirname "$0")/daemon-lib.sh"
trap 'stop_daemon; rm -rf "$work"' EXIT

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$daemon_pid/status"; }
# The part of it that is BPF maps mapped into the daemon: the 8 MiB ring
# buffer (mapped twice), resident once the kernel has written all of it.
ring_kib() {
	awk '/^[0-9a-f]+-[0-9a-f]+ / {bpf = ($6 == "anon_inode:bpf-map")} /^Rss:/ && bpf {s += $2} END {print s + 0}' \
		"/proc/$daemon_pid/smaps"
}

storm() {
	local t0 t1 i
	t0=$(date +%s%N)
	for ((i = 0; i < execs; i++)); do /bin/true; done
	t1=$(date +%s%N)
	echo $(((t1 - t0) / execs / 1000))
}

ratios=()
for ((r = 0; r < rounds; r++)); do
	if ((r % 2 == 0)); then order="A B"; else order="B A"; fi
	for side in $order; do
		if [ "$side" = B ]; then
			start_daemon /dev/null
			b=$(storm)
			stop_daemon
		else
			a=$(storm)
		fi
	done
	ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", b / a}')")
	echo "round $r: no daemon $a us/exec, daemon $b us/exec, ratio ${ratios[-1]}"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {printf "median daemon/no daemon: %.3f over %d rounds\n", v[int((NR+1)/2)], NR}'

start_daemon /dev/null
before=$(rss_kib)
progs=(/bin/true /bin/ls /bin/cat /bin/date /usr/bin/id /bin/uname /usr/bin/seq /bin/sleep /usr/bin/basename /bin/grep)
for ((i = 0; i < varied; i++)); do
	case $((i % 10)) in
	0) /bin/true ;;
	1) /bin/ls / >/dev/null ;;
	2) /bin/cat /dev/null ;;
	3) /bin/date >/dev/null ;;
	4) /usr/bin/id >/dev/null ;;
	5) /bin/uname >/dev/null ;;
	6) /usr/bin/seq 1 >/dev/null ;;
	7) /bin/sleep 0 ;;
	8) /usr/bin/basename /a/b >/dev/null ;;
	9) /bin/grep -q x /dev/null || true ;;
	esac
done
after=$(rss_kib)
ring=$(ring_kib)
profiles=$(find "$work/state/profiles" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)
echo "daemon RSS: ${before} KiB at start, ${after} KiB after ${varied} execs of ${#progs[@]} programs, of which ${ring} KiB BPF maps (the event ring buffer); ${profiles} profiles made"
"$ws" status --socket "$work/sock" | head -1
