#!/bin/sh
# One paired round: a standalone replay of the plan $1, waited for, then
# the same number of bytes read sequentially from the testbed's loop
# device with direct I/O. Run inside the testbed, caches dropped, e.g.:
#   warmstart-testbed run --fs ext4 --bind "$PWD" --bind /var/lib/warmstart \
#     -- ./paired.sh /var/lib/warmstart/profiles/npm-.../plan
# The plans were those `warmstart run` learned inside the testbed.
warmstart replay --wait --json "$1" > /tmp/rp.json 2>/dev/null
set -- $(python3 -c "
import json; d = json.load(open('/tmp/rp.json'))
print(d['data']['bytes'] + d['meta']['bytes'], d['timings']['total_ns'])")
MIB=$(( ($1 + 1048575) / 1048576 ))
SKIP=$(( 1024 + $(od -An -N2 -tu2 /dev/urandom) % 4096 ))
S=$(date +%s%N)
dd if=/dev/loop0 of=/dev/null iflag=direct bs=1M count=$MIB skip=$SKIP 2>/dev/null
E=$(date +%s%N)
python3 -c "print(f'{$1/1e6:.1f} MB replay {$2/1e6:.1f} ms seq {($E-$S)/1e6:.1f} ms ratio {$2/($E-$S):.2f}')"
