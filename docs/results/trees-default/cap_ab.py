"""Scratch A/B: aligned trees with sibling caps vs without (same run, interleaved)."""
import json, sys
sys.path.insert(0, "/work/main/benchmarks")
import torch
from paired_ab import paired_parser, run_paired
import lookahead
from lookahead.engine.draft import CandidateTree
real_cap = CandidateTree.cap_siblings
def main():
    args = paired_parser(__doc__).parse_args()
    torch.set_num_threads(args.threads)
    lm = lookahead.load(args.model)
    lookahead.generate(lm, "hello", max_new_tokens=8)
    def arm(cap: bool):
        def run(messages, calibrator, successors, n):
            CandidateTree.cap_siblings = real_cap if cap else (lambda self: None)
            try:
                return lookahead.generate(lm, messages, max_new_tokens=n, calibrator=calibrator,
                                          successors=successors, aligned_trees=True)
            finally:
                CandidateTree.cap_siblings = real_cap
        return run
    s = run_paired(args.workload, {"uncapped": arm(False), "capped": arm(True)}, "uncapped", "capped",
                   args.per_class, args.start, args.max_new_tokens)
    print(json.dumps(s))
main()
