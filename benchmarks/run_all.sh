#!/usr/bin/env bash
# One device call: GPU tests, then every benchmark; logs and JSON results under $OUT (or ./bench_results).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD KDTREE_BACKEND=cuda PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/bench_results}; mkdir -p "$OUT"
step() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$? ($name)"; grep -E "passed|failed|error" "$OUT/$name.txt" | tail -2; }
[ "${SKIP_TESTS:-0}" = 1 ] || step gpu_tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rf --timeout 120
[ "${SKIP_TESTS:-0}" = 1 ] || step cuda_suite 200 python3 -m pytest tests/kernels tests/decode -q -p no:cacheprovider -rf --timeout 120 -x
for b in ${BENCHES:-kernels tree verify pair_attention model e2e}; do step "bench_$b" 200 python3 "benchmarks/bench_$b.py"; tail -n 30 "$OUT/bench_$b.txt" | grep -v Warning | grep -v "warn(errors"; done
