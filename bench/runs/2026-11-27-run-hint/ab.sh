#!/bin/bash
# ab.sh ROUNDS: old and new `warmstart run` alternating on copies of one learned profile, caches dropped before each
R=${1:-12}
cd /tmp
L=$(/usr/bin/awk '$2=="/"{print $1}' /proc/mounts | /usr/bin/tail -1)
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; case $L in /dev/loop*) /usr/sbin/blockdev --flushbufs $L;; esac; }
B=/var/tmp/x/nw
S=/var/tmp/ab-state
rm -rf $S; mkdir -p $S
for prog in ${PROGS:-npm clang python}; do
  case $prog in
    npm) cmd=(npm config list --offline);;
    clang) cmd=(clang -O2 -c -o /tmp/h.o /work/main/bench/data/hello.c);;
    python) cmd=(/usr/bin/python3 -c "import numpy, scipy.optimize, scipy.linalg, scipy.sparse, scipy.stats");;
  esac
  for i in 1 2 3; do drop; $B/warmstart run -q --state-dir $S/$prog-new -- "${cmd[@]}" >/dev/null 2>&1; done
  cp -a $S/$prog-new $S/$prog-old
  for i in $(seq 1 $R); do
    if (( i % 2 )); then order="old new"; else order="new old"; fi
    for v in $order; do
      bin=$B/warmstart; [ $v = old ] && bin=$B/warmstart-old
      drop
      a=${EPOCHREALTIME/./}
      $bin run -q --state-dir $S/$prog-$v --report /tmp/rep.json -- "${cmd[@]}" >/dev/null 2>&1
      b=${EPOCHREALTIME/./}
      /usr/bin/python3 -c "
import json;r=json.load(open('/tmp/rep.json'));print('$prog', $i, '$v', round(($b-$a)/1e3,1), r['phase_before'], round(r.get('before_replay_ms') or -1,2), round(r.get('held_ms') or -1,2), r.get('named_by_hint'))"
    done
  done
done
