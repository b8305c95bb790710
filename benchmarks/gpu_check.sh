#!/usr/bin/env bash
# Speed check of the package on this machine's devices (a GPU, or the CPU); docs/scale.md.
#
#   bash benchmarks/gpu_check.sh            # full sizes: under 4 minutes on one H200-class GPU
#   QUICK=1 bash benchmarks/gpu_check.sh    # small sizes, to check the script on a CPU
#
# Prints jax.devices(), then benchmarks/gpu_check.py (integrate to tau = 300, the drift at
# H = 16, L = 8, F = 4 with 2^18 QMC points, simulate at D = 1e4 with 8 seeds to tau = 10), then
# the sweep benchmark benchmarks/05_sweep_parallel.py at a short horizon (SWEEP_TAU, default 20;
# serial only where dask's `distributed` is not installed). Installs nothing: the package is
# used from this checkout, its dependencies must be there already.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
start=$(date +%s)
python benchmarks/gpu_check.py
if [[ "${QUICK:-0}" == 1 ]]; then sweep_tau=${SWEEP_TAU:-2}; else sweep_tau=${SWEEP_TAU:-20}; fi
if python -c "import distributed" 2>/dev/null; then workers=2; else
    workers=1
    echo "sweep benchmark: dask's distributed is not installed here, the serial part alone"
fi
python benchmarks/05_sweep_parallel.py --tau-max "$sweep_tau" --workers "$workers"
echo "gpu_check: $(( $(date +%s) - start )) s in all"
