#!/usr/bin/env bash
# Benchmarks for `warmstart stream` (prefetchd's evaluation, scaled to this
# machine): each workload runs with no prefetcher, with a static aggressive
# prefetcher (fixed scale 8), and with warmstart's feedback-controlled one,
# interleaved round after round, each from a cold cache, with the loop
# device's read_ahead_kb at 8192 (this VM's disk) and at 128 (real disks).
# Prints medians, speedups against "none" from the same run, and the
# stream's accuracy and cost. Root; release build; ~5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
WS=$PWD/target/release/warmstart
FX=$PWD/target/release/ws-launch-fixture
ROUNDS=${ROUNDS:-3}
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 1; }
work=$(mktemp -d /var/tmp/ws-stream-bench.XXXX)
img=$work/fs.img; mnt=$work/mnt; mkdir -p "$mnt"
truncate -s 700M "$img"; mkfs.ext4 -q -F "$img"
dev=$(losetup --direct-io=on -f --show "$img")
cleanup() { umount "$mnt" 2>/dev/null || true; losetup -d "$dev" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mount "$dev" "$mnt"
"$FX" mkfile "$mnt/data.bin" 256
python3 - "$mnt/big.txt" <<'PY'
import random, sys
random.seed(7)
words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
with open(sys.argv[1], "w") as f:
    for i in range(2_000_000):
        f.write(" ".join(random.choice(words) for _ in range(10)) + f" {i}\n")
PY
sync
cold() { umount "$mnt"; blockdev --flushbufs "$dev"; mount "$dev" "$mnt"; }
now() { date +%s%N; }
declare -A W
W[slowthink]="$FX scan $mnt/data.bin 1024 4 forward"
W[backward]="$FX scan $mnt/data.bin 1024 4 backward"
W[strided]="$FX scan $mnt/data.bin 256 4 stride:768"
W[sha256sum]="sha256sum $mnt/data.bin"
W[grep]="grep -c juliet $mnt/big.txt"
order=(slowthink backward strided sha256sum grep)
declare -A T ACC COST
for ra in 8192 128; do
  echo "$ra" > "/sys/block/$(basename "$dev")/queue/read_ahead_kb"
  for r in $(seq 1 "$ROUNDS"); do
    for w in "${order[@]}"; do
      for s in none static stream; do
        cold
        case $s in
          none) pre=() ;;
          static) pre=("$WS" stream -q --static-scale 8 --) ;;
          stream) pre=("$WS" stream --) ;;
        esac
        t0=$(now)
        if [ $s = stream ]; then
          # shellcheck disable=SC2086
          "${pre[@]}" ${W[$w]} > /dev/null 2> "$work/summary"
        else
          # shellcheck disable=SC2086
          "${pre[@]}" ${W[$w]} > /dev/null
        fi
        t1=$(now)
        T[$ra,$w,$s]+="$(( (t1 - t0) / 1000 )) "
        if [ $s = stream ]; then
          read -r a c < <(sed -n 's/.*accuracy \([0-9]*\)%, cost \([0-9.]*\).*/\1 \2/p' "$work/summary" | tail -1)
          a=$(awk -v a="${a:-0}" 'BEGIN {print a/100}')
          ACC[$ra,$w]+="$a "; COST[$ra,$w]+="$c "
        fi
        printf '\r  read_ahead_kb=%s round %d/%d %-10s %-7s' "$ra" "$r" "$ROUNDS" "$w" "$s" >&2
      done
    done
  done
done
echo >&2
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for ra in 8192 128; do
  echo
  echo "read_ahead_kb = $ra (medians of $ROUNDS; speedup = t_none / t)"
  printf '| %-10s | %9s | %9s | %7s | %9s | %7s | %8s | %5s |\n' workload "none s" "static s" speedup "stream s" speedup accuracy cost
  printf '|%s|\n' "------------|-----------|-----------|---------|-----------|---------|----------|-------"
  for w in "${order[@]}"; do
    n=$(median "${T[$ra,$w,none]}"); st=$(median "${T[$ra,$w,static]}"); sm=$(median "${T[$ra,$w,stream]}")
    a=$(median "${ACC[$ra,$w]}"); c=$(median "${COST[$ra,$w]}")
    awk -v w="$w" -v n="$n" -v st="$st" -v sm="$sm" -v a="$a" -v c="$c" 'BEGIN {
      printf "| %-10s | %9.2f | %9.2f | %7.2f | %9.2f | %7.2f | %7.0f%% | %5.2f |\n", w, n/1e6, st/1e6, n/st, sm/1e6, n/sm, a*100, c }'
  done
done
