# Sourced by the scripts that time programs with and without a daemon:
# start_daemon CONFIG starts `$ws daemon` on a fresh state directory under
# $work and waits until it answers as a daemon; stop_daemon stops it.
# The caller sets $ws (the warmstart binary) and $work (a scratch
# directory it removes), and runs stop_daemon on exit.

daemon_pid=

stop_daemon() {
	if [ -n "$daemon_pid" ]; then
		kill "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
		daemon_pid=
	fi
}

start_daemon() {
	rm -rf "$work/state"
	"$ws" daemon --config "$1" --state-dir "$work/state" --socket "$work/sock" \
		2>"$work/daemon.log" &
	daemon_pid=$!
	# `status` answers without a daemon too ("daemon": null): wait for one.
	for _ in $(seq 100); do
		kill -0 "$daemon_pid" 2>/dev/null || break
		"$ws" status --socket "$work/sock" --json 2>/dev/null | grep -q '"daemon": *{' && return 0
		sleep 0.1
	done
	echo "the daemon did not answer; its log:" >&2
	cat "$work/daemon.log" >&2
	exit 1
}
