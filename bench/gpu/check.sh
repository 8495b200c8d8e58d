#!/usr/bin/env bash
# The GPU checks, as one prepared run on a lent CUDA machine (the device tool; see bench/results/README.md):
# the packages its image lacks come as wheels in .whl (carried), then the CUDA tests' modules whole (one
# process, as an engine would load them), then the GPU bench lines. Logs land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
BENCH=(python3 -c 'import sys; from tiercache.bench.cli import main; sys.exit(main(sys.argv[1:]))')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0)); print("cudart has cudaGetLastError:", hasattr(torch.cuda.cudart(), "cudaGetLastError"))'
[ "${1:-}" = bench ] || {
MODS="tests/connector/test_layerwise.py tests/connector/test_kv.py tests/connector/test_pinning.py tests/tiercache/test_shm.py tests/tiercache/tiers/test_lmdb.py tests/connector/vllm/test_config_layout.py tests/connector/sglang/test_gpu_runtime.py"
timeout 200 python3 -m pytest -p no:cacheprovider -q -x --timeout 120 $MODS 2>&1 | tee "$OUT/pytest-modules.log" | tail -15
timeout 100 python3 -m pytest -p no:cacheprovider -q -m gpu --timeout 60 -rs $MODS 2>&1 | tee "$OUT/pytest-gpu.log" | tail -8
}
timeout 120 "${BENCH[@]}" connector --layouts 7b,tiny --rounds 3 --threads 16 --json "$OUT/connector.json" 2>&1 | tee "$OUT/connector.txt" | tail -30
timeout 110 "${BENCH[@]}" tiers --tiers L1,L2 --device cuda --chunk-sizes 512K,32M --bytes-per-size 256M --rounds 3 --threads 16 --json "$OUT/tiers.json" 2>&1 | tee "$OUT/tiers.txt" | tail -25
