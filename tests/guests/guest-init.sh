#!/bin/sh
# Runs in the guest at the end of its boot, from guest-boot.sh with the
# host's job directory mounted at /host: runs /host/job.sh as root with
# its output in /host/out/job.log and its status in /host/out/job.rc,
# then powers off.
# A job that wants a reboot writes /host/out/reboot and exits 0; the next
# boot runs job.sh again (it reads its own state from /host).
(cd /host && bash ./job.sh) >>/host/out/job.log 2>&1
echo $? >/host/out/job.rc
sync
if [ -f /host/out/reboot ]; then
	# The host boots the same disk again (QEMU runs with -no-reboot).
	rm -f /host/out/job.rc
	systemctl reboot
else
	systemctl poweroff
fi
