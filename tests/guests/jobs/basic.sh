#!/bin/bash
# The guest job every release runs (tests/guests/matrix): warmstart's
# static binaries on the guest's stock kernel, as root.
#   record-cold, record-warm  `warmstart record` of reader.py holds >= 99%
#                             of the pages it reads, cold and then warm
#   run-status                `warmstart run` runs the program on each of
#                             four launches, its exit status kept
#   run-learns, run-prefetches  ... learns it, then prefetches it
#   stream-runs               `warmstart stream` runs a sequential reader
#   daemon-learns, daemon-prefetches  the daemon started by hand learns
#                             and prefetches another user's launch
# and "info KEY VALUE" lines for the supported-kernels table: the shares
# recorded, the metadata read from the device, how page uses are seen.
# One line per check in out/results ("ok NAME" or "FAIL NAME: why"); the
# logs beside it.
set -u
OUT=/host/out
RES=$OUT/results
: >"$RES"
ok() { echo "ok $1" >>"$RES"; }
fail() { echo "FAIL $1: $2" >>"$RES"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
py_share() { python3 -c "import json,sys; print('%.1f%%' % (100 * json.load(open(sys.argv[1]))['share']))" "$1" 2>/dev/null || echo '?'; }
jq_py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

install -m 0755 /host/bin/warmstart /host/bin/warmstart-core /usr/local/bin/
install -m 0755 /host/reader.py /usr/local/bin/ws-reader
R=/var/tmp/reader
READ=(python3 /usr/local/bin/ws-reader read "$R")
ws-reader setup "$R"
chmod -R a+rX "$R"
uname -r >"$OUT/uname"
warmstart --version >"$OUT/version" 2>&1

# --- record, cold and warm ---
record() { # NAME
	warmstart record -o "/var/tmp/$1.trace" -- "${READ[@]}" >"$OUT/$1.log" 2>&1 ||
		{ fail "$1" "record exited $? ($(tail -n 1 "$OUT/$1.log"))"; return; }
	warmstart show "/var/tmp/$1.trace" --format json >"/var/tmp/$1.json" 2>>"$OUT/$1.log"
	if ws-reader check "$R" "/var/tmp/$1.json" >"$OUT/$1.json"; then
		ok "$1"
	else
		fail "$1" "$(cat "$OUT/$1.json")"
	fi
}
cold
record record-cold
"${READ[@]}"
record record-warm

info() { echo "info $1 $2" >>"$RES"; }
info record-cold "$(py_share "$OUT/record-cold.json")"
info record-warm "$(py_share "$OUT/record-warm.json")"
info metadata "$(jq_py 'str(d["stats"]["metadata_bytes"] // 1024) + "KiB"' </var/tmp/record-cold.json 2>/dev/null || echo '?')"

# --- stream: a sequential reader of a file larger than its read-ahead ---
dd if=/dev/urandom of=/var/tmp/stream.bin bs=1M count=64 status=none
cold
if warmstart stream --json -- python3 -c "
f = open('/var/tmp/stream.bin', 'rb')
while f.read(1 << 16):
    pass" >"$OUT/stream.json" 2>"$OUT/stream.log"; then
	ok stream-runs
else
	fail stream-runs "exit $? ($(tail -n 1 "$OUT/stream.log"))"
fi

# --- run: four launches ---
S=/var/tmp/run-state
statuses=""
for i in 1 2 3 4; do
	cold
	warmstart run -v --report "$OUT/run-$i.json" --state-dir "$S" -- "${READ[@]}" 7 >>"$OUT/run.log" 2>&1
	statuses="$statuses $?"
done
if [ "$statuses" = " 7 7 7 7" ]; then ok run-status; else fail run-status "exit statuses:$statuses"; fi
warmstart status --state-dir "$S" --json >"$OUT/run-status.json" 2>>"$OUT/run.log"
phase=$(jq_py '",".join(p["phase"] for p in d["profiles"])' <"$OUT/run-status.json")
case "$phase" in
*prefetching*) ok run-learns ;;
*) fail run-learns "profiles' phases: '$phase'" ;;
esac
# The last launch's report: a replay ran beside it.
issued=$(jq_py '(d.get("replay") or {}).get("requests", 0)' <"$OUT/run-4.json" 2>/dev/null || echo 0)
if [ "${issued:-0}" -gt 0 ]; then
	ok run-prefetches
else
	fail run-prefetches "the last launch's report has no replay: $(head -c 300 "$OUT/run-4.json" 2>/dev/null)"
fi

# --- the daemon, started by hand; a user's launches ---
D=/var/tmp/daemon-state
SOCK=/run/ws-test.sock
cat >/var/tmp/daemon.toml <<EOF
state_dir = "$D"
socket = "$SOCK"
min_learn_kib = 64
[startup]
enabled = false
[preload]
enabled = false
EOF
warmstart daemon --config /var/tmp/daemon.toml >"$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 60); do [ -S "$SOCK" ] && break; sleep 1; done
daemon_status() { warmstart status --socket "$SOCK" --state-dir "$D" --json 2>/dev/null; }
learned=0 prefetched=0
for i in $(seq 8); do
	cold
	su wsuser -c "python3 /usr/local/bin/ws-reader read $R" >>"$OUT/daemon-launches.log" 2>&1
	sleep 4 # the daemon learns in the background after the launch
	st=$(daemon_status)
	learned=$(echo "$st" | jq_py 'd["daemon"]["launches_learned"] if d["daemon"] else 0' 2>/dev/null || echo 0)
	prefetched=$(echo "$st" | jq_py 'd["daemon"]["launches_prefetched"] if d["daemon"] else 0' 2>/dev/null || echo 0)
	[ "$prefetched" -ge 1 ] && break
done
daemon_status >"$OUT/daemon-status.json"
info page-uses "$(jq_py '(d["daemon"] or {}).get("page_uses", "?")' <"$OUT/daemon-status.json" 2>/dev/null || echo '?')"
if kill -0 "$DPID" 2>/dev/null; then
	[ "$learned" -ge 1 ] && ok daemon-learns || fail daemon-learns "launches_learned=$learned (see daemon.log)"
	[ "$prefetched" -ge 1 ] && ok daemon-prefetches || fail daemon-prefetches "launches_prefetched=$prefetched"
else
	wait "$DPID"
	fail daemon-learns "the daemon exited with $? ($(tail -n 1 "$OUT/daemon.log"))"
	fail daemon-prefetches "no daemon"
fi
kill "$DPID" 2>/dev/null
wait "$DPID" 2>/dev/null
exit 0
