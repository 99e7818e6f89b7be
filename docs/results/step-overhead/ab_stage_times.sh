#!/bin/bash
# Stage times before and after, alternating, on the same machine minutes apart.
# Usage: ab_stage_times.sh OLD_CHECKOUT (e.g. `git worktree add /tmp/old c0376d6`); run from the repository
# root with its virtual environment active. Each arm imports lookahead from its own checkout (PYTHONPATH).
OLD=${1:?give the checkout of the older commit}
NEW=$(pwd)
SCRIPT=$NEW/docs/results/step-overhead/stage_times.py
for round in 1 2; do
  for arm in "$OLD" "$NEW"; do
    echo "== round $round arm $(cd "$arm" && git rev-parse --short HEAD)"
    (cd /tmp && PYTHONPATH=$arm python "$SCRIPT" autoregressive,prompt_lookup,lookahead 1 abcdef)
  done
done
