#!/bin/bash
# The package job (tests/guests/matrix --job package): Debian's package of
# warmstart under the guest's own systemd, across real reboots.
#   boot 1: unit-active, unit-no-restarts, unit-no-eperm   `apt install ./deb`
#             gives an active unit, never restarted, no EPERM in its journal
#           unit-learns, unit-prefetches   a user's launch from a login
#             session (su -l) is learned and prefetched under the unit
#           unit-warm-not-replayed   a warm relaunch is found resident and
#             not replayed
#           trigger-relearns   upgrading a package whose files a profile
#             reads (dpkg -i of a newer .deb) sends it back to learning
#           then two reboots, each recorded as a boot (the boot plan needs two)
#   boot 4: boot-plan-replayed   the boot plan replays at this boot
#             (journal and status)
#           preload-not-reread   on a quiet machine no plan is preloaded
#             again while it stays resident
#           purge-clean   `apt purge` leaves no file, unit or state behind
set -u
OUT=/host/out
RES=$OUT/results
STAGE=$(cat "$OUT/stage" 2>/dev/null || echo 1)
ok() { echo "ok $1" >>"$RES"; }
fail() { echo "FAIL $1: $2" >>"$RES"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
status_json() { warmstart status --json 2>/dev/null; }
daemon_field() { status_json | py "(d.get('daemon') or {}).get('$1', 0)" 2>/dev/null || echo 0; }
reboot_into() { echo "$1" >"$OUT/stage"; touch "$OUT/reboot"; exit 0; }
journal() { journalctl -b -u warmstart --no-pager -o cat 2>/dev/null; }

case "$STAGE" in
1)
	: >"$RES"
	uname -r >"$OUT/uname"
	install -m 0755 /host/reader.py /usr/local/bin/ws-reader
	R=/var/tmp/reader
	ws-reader setup "$R"
	chmod -R a+rX "$R"
	cp /host/warmstart.deb /var/tmp/
	DEBIAN_FRONTEND=noninteractive apt-get install -y /var/tmp/warmstart.deb >"$OUT/install.log" 2>&1 ||
		fail install "apt-get install exited $?: $(tail -n 3 "$OUT/install.log" | tr '\n' ' ')"
	for _ in $(seq 30); do systemctl is-active -q warmstart && break; sleep 1; done
	sleep 5
	if systemctl is-active -q warmstart; then ok unit-active; else fail unit-active "$(systemctl is-active warmstart)"; fi
	n=$(systemctl show -p NRestarts --value warmstart)
	[ "$n" = 0 ] && ok unit-no-restarts || fail unit-no-restarts "NRestarts=$n"
	# The launches: a login session of another user, caches cold each time.
	for i in $(seq 8); do
		cold
		su -l wsuser -c "python3 /usr/local/bin/ws-reader read $R" >>"$OUT/launches.log" 2>&1
		sleep 4
		[ "$(daemon_field launches_prefetched)" -ge 1 ] && break
	done
	status_json >"$OUT/status-1.json"
	[ "$(daemon_field launches_learned)" -ge 1 ] && ok unit-learns || fail unit-learns "launches_learned=$(daemon_field launches_learned)"
	[ "$(daemon_field launches_prefetched)" -ge 1 ] && ok unit-prefetches || fail unit-prefetches "launches_prefetched=$(daemon_field launches_prefetched)"
	# Where the prefetched pages are charged: the daemon's cgroup (cgroup v2
	# charges a page cache page to whoever read it first), with no limit
	# there to cap or reclaim them.
	cg=/sys/fs/cgroup$(cut -d: -f3 /proc/"$(systemctl show -p MainPID --value warmstart)"/cgroup)
	echo "info cgroup-memory-max $(cat "$cg/memory.max" 2>/dev/null)" >>"$RES"
	echo "info cgroup-file-kib $(($(awk '$1 == "file" {print $2}' "$cg/memory.stat" 2>/dev/null || echo 0) / 1024))" >>"$RES"
	# Warm: the same launch again, its files still cached.
	before=$(daemon_field launches_cached)
	su -l wsuser -c "python3 /usr/local/bin/ws-reader read $R" >>"$OUT/launches.log" 2>&1
	sleep 3
	after=$(daemon_field launches_cached)
	[ "$after" -gt "$before" ] && ok unit-warm-not-replayed || fail unit-warm-not-replayed "launches_cached $before -> $after"
	# A package upgraded for real: a program whose data a package ships,
	# learned, then the package upgraded with other data.
	make_pkg() { # VERSION
		local d=/var/tmp/wsdemo-$1
		mkdir -p "$d/DEBIAN" "$d/usr/bin" "$d/usr/share/wsdemo"
		printf 'Package: wsdemo\nVersion: %s\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n' "$1" >"$d/DEBIAN/control"
		printf '#!/usr/bin/python3\nimport glob\nfor p in sorted(glob.glob("/usr/share/wsdemo/*")):\n    open(p, "rb").read()\n' >"$d/usr/bin/wsdemo"
		chmod 0755 "$d/usr/bin/wsdemo"
		for n in 1 2 3; do head -c 3M /dev/urandom >"$d/usr/share/wsdemo/data$n"; done
		dpkg-deb -b "$d" "/var/tmp/wsdemo_$1.deb" >/dev/null
	}
	make_pkg 1 && make_pkg 2
	dpkg -i /var/tmp/wsdemo_1.deb >>"$OUT/install.log" 2>&1
	profile_phase() { status_json | py "','.join(p['phase'] for p in d['profiles'] if 'wsdemo' in ' '.join(p.get('command') or []) + p.get('name', ''))" 2>/dev/null; }
	for _ in $(seq 8); do
		cold
		su -l wsuser -c wsdemo >>"$OUT/launches.log" 2>&1
		sleep 4
		case "$(profile_phase)" in *prefetching*) break ;; esac
	done
	before=$(profile_phase)
	dpkg -i /var/tmp/wsdemo_2.deb >>"$OUT/install.log" 2>&1
	for _ in $(seq 30); do case "$(profile_phase)" in *learning*) break ;; esac; sleep 1; done
	after=$(profile_phase)
	case "$before/$after" in
	*prefetching*/*learning*) ok trigger-relearns ;;
	*) fail trigger-relearns "wsdemo's profile: '$before' before the upgrade, '$after' after" ;;
	esac
	journal >"$OUT/journal-1.log"
	if grep -qiE "EPERM|Operation not permitted" "$OUT/journal-1.log"; then
		fail unit-no-eperm "$(grep -iE 'EPERM|Operation not permitted' "$OUT/journal-1.log" | head -n 2 | tr '\n' ' ')"
	else
		ok unit-no-eperm
	fi
	# A service of the system's own that reads at every boot, after the
	# daemon has started (as a display manager or a database would): what
	# the boot plan is made of. This minimal image starts little else.
	cat >/etc/systemd/system/ws-bootwork.service <<-EOF
		[Unit]
		After=warmstart.service
		[Service]
		Type=oneshot
		ExecStartPre=/bin/sleep 2
		ExecStart=/usr/bin/python3 /usr/local/bin/ws-reader read $R
		[Install]
		WantedBy=multi-user.target
	EOF
	systemctl enable -q ws-bootwork.service
	reboot_into 2
	;;
2 | 3)
	# Each boot is recorded once the daemon has watched it go quiet.
	for _ in $(seq 90); do
		[ "$(status_json | py "(d.get('daemon') or {}).get('foresight', {}).get('startups_recorded', 0)")" -ge 1 ] && break
		sleep 2
	done
	status_json >"$OUT/status-$STAGE.json"
	journal >"$OUT/journal-$STAGE.log"
	reboot_into $((STAGE + 1))
	;;
4)
	for _ in $(seq 60); do
		[ "$(status_json | py "(d.get('daemon') or {}).get('foresight', {}).get('startup_replays', 0)")" -ge 1 ] && break
		sleep 2
	done
	status_json >"$OUT/status-4.json"
	journal >"$OUT/journal-4.log"
	replays=$(py "(d.get('daemon') or {}).get('foresight', {}).get('startup_replays', 0)" <"$OUT/status-4.json")
	if [ "$replays" -ge 1 ] && grep -q "boot startup: replaying" "$OUT/journal-4.log"; then
		ok boot-plan-replayed
	else
		fail boot-plan-replayed "startup_replays=$replays; journal: $(grep -i startup "$OUT/journal-4.log" | tail -n 2 | tr '\n' ' ')"
	fi
	# Preloads the boot's own launches interrupted start again (counted in
	# the info line); once the machine is quiet and the plans resident,
	# none is read again.
	per_boot=""
	for f in "$OUT"/journal-*.log; do per_boot="$per_boot $(grep -c "preloading .* again" "$f")"; done
	echo "info preload-rereads-per-boot$per_boot" >>"$RES"
	for _ in $(seq 30); do
		[ "$(status_json | py "(d.get('daemon') or {}).get('foresight', {}).get('preload_state', '')")" != preloading ] && break
		sleep 2
	done
	before=$(journal | grep -c "preloading")
	sleep 30
	after=$(journal | grep -c "preloading")
	[ "$after" = "$before" ] && ok preload-not-reread ||
		fail preload-not-reread "$((after - before)) preloads in 30 s of a quiet machine: $(journal | grep preloading | tail -n 2 | tr '\n' ' ')"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y warmstart >"$OUT/purge.log" 2>&1
	left=$(ls -d /var/lib/warmstart /etc/warmstart /run/warmstart /lib/systemd/system/warmstart.service \
		/etc/systemd/system/multi-user.target.wants/warmstart.service /usr/bin/warmstart /usr/lib/warmstart 2>/dev/null)
	if [ -z "$left" ] && ! systemctl is-active -q warmstart; then ok purge-clean; else fail purge-clean "left: $left"; fi
	;;
esac
exit 0
