#!/usr/bin/env bash
# The evaluation issue's speed check: a 100-item-per-bin niah sweep to 32k with `armt` (the
# shipped adapter), timed from start to finish, model loads included. Two evaluations run side by
# side with one thread each: the 32k bin alone, and 1k-16k (about the same number of tokens).
#
#   scripts/niah_sweep_timed.sh                 # into docs/eval-sweep (must hold no niah lines yet)
#   RESULTS=/tmp/s N=10 BATCH=4 scripts/niah_sweep_timed.sh
set -euo pipefail
RESULTS=${RESULTS:-docs/eval-sweep}
N=${N:-100}
BATCH=${BATCH:-1}
if compgen -G "$RESULTS/*/niah.armt.jsonl" > /dev/null; then
  echo "error: $RESULTS already holds niah lines: a resumed sweep skips them and its time means nothing" >&2
  exit 1
fi
mkdir -p "$RESULTS"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
start=$(date +%s)
edgemem eval --task niah --method armt --lengths 32k -n "$N" --batch "$BATCH" --results "$RESULTS" 2> "$RESULTS/32k.log" &
long=$!
edgemem eval --task niah --method armt --lengths 1k,2k,4k,8k,16k -n "$N" --batch "$BATCH" --results "$RESULTS" 2> "$RESULTS/1k-16k.log"
wait "$long"
end=$(date +%s)
echo "niah sweep, $N items per bin, 1k-32k, batch $BATCH: $(( end - start )) s wall ($(date -u -d @"$start" +%FT%TZ) to $(date -u -d @"$end" +%FT%TZ))"
tail -n 1 "$RESULTS/32k.log" "$RESULTS/1k-16k.log"
edgemem eval plot --results "$RESULTS" --out "$RESULTS/accuracy.png"   # the per-bin table, untimed
