#!/usr/bin/env bash
# Train a config to its last step, stage its adapter, read it on the validation niah bins
# furthest from the 90% first and, where those reach it, on the test bins a ship needs:
# the pipeline a long CPU run goes through unattended.
# Resumable at every point: run the same command again after an interruption (a session's end,
# a kill). `edgemem train` resumes from RUN's checkpoint (a step cut mid-way goes on after its
# last finished micro-batch), and `edgemem eval` skips the items its results file already has.
#
#     scripts/train_validate.sh CONFIG NAME [LENGTHS]    # LENGTHS default "64k 32k 16k"
#
# writes runs/NAME/ (the run), docs/train/NAME/ (its log and curves, to commit),
# runs/stage-NAME/ (the float16 adapter and card as they would ship, read in sentence-aligned
# segments of 48 tokens as the shipped adapter is), runs/NAME-val/ (the validation lines),
# runs/NAME-test/ (the test lines: niah 16k-64k and 1k-8k, docqa 1k-8k, only where validation
# 32k and 64k both reach 18 of 20) and prints each bin's table (`edgemem eval plot`). Nothing is
# shipped: that is a reviewed commit (`python scripts/ship_adapter.py` into edgemem/adapters/).
# Each bin is read by two one-thread processes sharing its items (their lock files keep them
# apart), the fastest way on two cores. Run from the repository root after `edgemem data prepare`;
# in the background: setsid nohup scripts/train_validate.sh CONFIG NAME >> runs/NAME.out 2>&1 &
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/train_validate.sh CONFIG NAME [LENGTHS]" >&2; exit 2; }
CONFIG=$1
NAME=$2
LENGTHS=${3:-64k 32k 16k}
[ -f "$CONFIG" ] || { echo "error: no config at $CONFIG" >&2; exit 1; }
RUN=runs/$NAME
STAGE=runs/stage-$NAME
VAL=runs/$NAME-val
TEST=runs/$NAME-test
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000} # a second busy process must not spin the cores away

read_bins() { # TASK SPLIT RESULTS LENGTH...: each bin by two one-thread readers, then the table
    local task=$1 split=$2 results=$3 length pid pids
    shift 3
    for length in "$@"; do
        echo "$(date -u +%FT%TZ) $split $task $length"
        pids=()
        for _ in 1 2; do
            OMP_NUM_THREADS=1 edgemem eval --task "$task" --lengths "$length" -n 20 --dtype float32 \
                --adapter "$ADAPTER" --split "$split" \
                --results "$results" &
            pids+=($!)
        done
        for pid in "${pids[@]}"; do wait "$pid"; done # a failed reader ends the script (set -e)
        edgemem eval plot --results "$results" --out "$results/accuracy.png"
    done
}

echo "$(date -u +%FT%TZ) train $CONFIG -> $RUN"
edgemem train "$CONFIG" --out "$RUN"
mkdir -p "docs/train/$NAME"
cp "$RUN/log.jsonl" "$RUN/curves.png" "docs/train/$NAME/"
python scripts/ship_adapter.py "$RUN/adapter.safetensors" --run "docs/train/$NAME" --out "$STAGE" \
    --segment-align 48
# ship_adapter names the staged file after the config's model
MODEL=$(python -c 'import sys; from edgemem.train import load_config; print(load_config(sys.argv[1]).model)' "$CONFIG")
ADAPTER=$STAGE/$MODEL.safetensors
# shellcheck disable=SC2086 # LENGTHS is a list
read_bins niah validation "$VAL" $LENGTHS
# A bin's count as `edgemem eval plot` makes it: the staged adapter's lines on the latest corpora
# build only. The shipped adapter misses 90% on validation 32k and 64k (docs/RESULTS.md).
if python -c '
import sys
from pathlib import Path

from edgemem.evaluate import load_records, summarize

rows = {
    r["length"]: r
    for r in summarize(load_records(Path(sys.argv[1])))
    if (r["task"], r["method"]) == ("niah", "armt-val")
}
count = {n: round(rows[n]["accuracy"] * rows[n]["n"]) if n in rows else 0 for n in (65536, 32768)}
print("validation: 64k %d, 32k %d of 20" % (count[65536], count[32768]))
sys.exit(0 if min(count.values()) >= 18 else 1)
' "$VAL"; then
    read_bins niah test "$TEST" 64k 32k 16k 1k 2k 4k 8k
    read_bins docqa test "$TEST" 1k 2k 4k 8k
fi
echo "$(date -u +%FT%TZ) done: $VAL"
