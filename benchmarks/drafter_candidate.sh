#!/usr/bin/env bash
# One device call: train a candidate DFlash drafter for the shipped target and measure its held-out HumanEval
# acceptance beside the shipped drafter's (same call, same machine). Everything comes back as ONE file,
# $OUT/candidate.tar (the device tool returns at most 8 files): the drafter directory (config.json,
# model.safetensors), its drafter_train_log.json, tau_candidate.json / tau_shipped.json (eval_humaneval.py) and
# the logs. Ship a candidate with the steps in docs/PERFORMANCE.md ("the drafter on 4x the regenerated text").
#
#   python -m kdtree_numba.train corpus --out .corpus          # on the work machine (~1 min, offline), then carry it
#   OUT=$OUT CORPUS=.corpus bash benchmarks/drafter_candidate.sh --regen 8192 --regen-max-seconds 200 --regen-docstring 0.5
#
# Arguments go to `python -m kdtree_numba.train drafter`; SKIP_SHIPPED=1 leaves out the shipped drafter's tau;
# PROMPTS=N evaluates the first N held-out prompts only (a smoke run; default all 164). The candidate's eval also
# times it as the card's eval does (replayed, the same prompts, budgets 32 and 64, 3 passes; SPEED_BUDGETS=32
# times one budget, SKIP_SPEED=1 leaves the timing out): tau_candidate.json records the weights' sha256, so once
# the candidate is shipped it serves the model card as its GPU eval (`python -m kdtree_numba.train card --gpu-eval
# tau_candidate.json`, or copied to eval_humaneval_gpu.json).
# SAMPLED_T=T adds sampled acceptance at temperature T (prompt i with seed i, budgets 32 and 64, not timed):
# tau_candidate_sampled.json, and tau_shipped_sampled.json unless SKIP_SHIPPED=1 (a drafter trained with
# --regen-sampled against the shipped one).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder for candidate.tar}
CORPUS=${CORPUS:-.corpus}
W=$(mktemp -d)
trap 'tar -cf "$OUT/candidate.tar" -C "$W" .' EXIT                  # whatever exists, even after a failure
python3 -m kdtree_numba.train drafter --data "$CORPUS" --target kdtree_numba/default_model/target \
    --out "$W/drafter" "$@" 2>&1 | tee "$W/train.log"
tau() { python3 benchmarks/eval_humaneval.py --skip-bpb --replay-tau --budgets 32,64 \
        ${PROMPTS:+--prompts "$PROMPTS"} --out "$W/$1.json" "${@:2}" 2>&1 | tee "$W/$1.log" | tail -n 24; }
speed=(--replay-only --speed-subset ${PROMPTS:-164} --repeats 3 --speed-budget ${SPEED_BUDGETS:-32,64})
[ "${SKIP_SPEED:-0}" = 1 ] && speed=(--skip-speed)
tau tau_candidate --drafter "$W/drafter" "${speed[@]}"
[ "${SKIP_SHIPPED:-0}" = 1 ] || tau tau_shipped --skip-speed
if [ -n "${SAMPLED_T:-}" ]; then
    sampled=(--temperature "$SAMPLED_T" --budgets 32,64 --skip-speed)
    tau tau_candidate_sampled --drafter "$W/drafter" "${sampled[@]}"
    [ "${SKIP_SHIPPED:-0}" = 1 ] || tau tau_shipped_sampled "${sampled[@]}"
fi
