#!/usr/bin/env bash
# The GPU checks, in under 7 minutes on one GPU (the parts' time limits add up to 390 s): (a) short CUDA runs of the engine, one method per family;
# (b) FedCAC's paper round (40 clients, ResNet-8, batch 100, E=5) with the clients trained in turn and together;
# (c) 1, 2, 4 and 8 copies of one run at once on the GPU. Results: $OUT/gpu_check.md and $OUT/gpu_check.json
# (plus each part's JSON and the machine's description). Each part runs in its own process with its own time
# limit, so one failing or slow part does not lose the others.
#
#   OUT=/tmp/out bash scripts/gpu_check.sh                                    on the GPU machine, from the repository root
#   OUT=/tmp/out GPU_CHECK_DEVICE=cpu GPU_CHECK_SCALE=tiny bash scripts/gpu_check.sh     a quick check of the script
#
# The project's pure-Python dependencies that such a machine lacks (Hydra, OmegaConf, ANTLR, submitit) come as
# wheels in .whl/ and are installed into /tmp/site first.
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-}
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export WANDB_MODE=disabled PFL_DATA_ROOT=${PFL_DATA_ROOT:-data}
PY=${PYTHON:-python3}
started=$(date +%s)
part() {  # part <name> <seconds> : one part of scripts/gpu_check.py under its time limit
  echo "=== $1 (limit $2 s, at $(( $(date +%s) - started )) s)"
  timeout --kill-after=10 "$2" "$PY" scripts/gpu_check.py "$1" --out "$OUT" || echo "=== $1 ended with status $?"
}
part env 40
part cuda-runs 100
part round-time 110
part concurrency 120
part report 20
echo "=== done in $(( $(date +%s) - started )) s"
