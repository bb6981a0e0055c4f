#!/usr/bin/env bash
# The evaluation behind docs/RESULTS.md: every method on every task, 1k to 64k tokens, then the
# transformers cross-check of the llama.cpp window baseline, then the table and the plot.
# Resumable: re-running skips items already in docs/eval/. N items per length bin (default 5).
set -euo pipefail
N=${N:-5}
LENGTHS=${LENGTHS:-1k,2k,4k,8k,16k,32k,64k}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
for task in niah docqa vt types; do
  for method in oracle window rag armt; do
    edgemem eval --task "$task" --method "$method" --lengths "$LENGTHS" -n "$N"
  done
done
edgemem eval --task niah --method window --engine hf --lengths 1k,2k,4k,8k -n "$N"
edgemem eval plot --update docs/RESULTS.md
