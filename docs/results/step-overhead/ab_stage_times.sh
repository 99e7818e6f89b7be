#!/bin/bash
# stage times before (c0376d6) and after (HEAD), alternating, same machine minutes apart
cd /work/main
for round in 1 2; do
  for arm in old new; do
    if [ $arm = old ]; then PP=/tmp/s23/old; else PP=/work/main; fi
    echo "== round $round arm $arm ($(cd $PP && git rev-parse --short HEAD)) $(python /tmp/bwq.py)"
    (cd /tmp && PYTHONPATH=$PP /work/main/.venv/bin/python /work/main/docs/results/step-overhead/stage_times.py autoregressive,prompt_lookup,lookahead 1 abcdef)
  done
done
