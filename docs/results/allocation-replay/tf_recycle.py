"""Teacher-forced: does the probability a recycled successor had when it was recorded separate hits
better than its rank? Table keyed by (previous token, token) -> top-8 (tokens, probs) of the latest
row written; rows written at answer positions only; lookups before the write at that position."""
import pickle, sys, collections, torch
import lookahead
torch.set_num_threads(2)
m = lookahead.load("smollm2-135m-instruct")
for f in sys.argv[1:]:
    d = pickle.load(open(f, "rb"))
    table = {}
    # answers[i] = prompt + answer; prompt length from the first logged step of request i
    plen = {}
    for s in d["steps"]:
        plen.setdefault(s["req"], s["L"])
    stats = collections.defaultdict(lambda: [0, 0])
    for i, seq in enumerate(d["answers"]):
        x = torch.tensor([seq])
        with torch.no_grad():
            logits = m.model(input_ids=x).logits[0].float()
        probs = torch.softmax(logits, -1)
        top = torch.topk(probs, 8, dim=-1)
        start = plen[i] - 1  # the first root
        for t in range(start, len(seq) - 1):
            key = (seq[t - 1], seq[t])
            if key in table:
                toks, ps = table[key]
                nxt = seq[t + 1]
                for r in range(8):
                    pb = min(int(ps[r] * 5), 4)
                    e = stats[(r if r < 3 else 3, pb)]; e[0] += 1; e[1] += toks[r] == nxt
            table[key] = (top.indices[t].tolist(), top.values[t].tolist())
    print(f)
    for r in range(4):
        row = []
        tot = [sum(stats[(r, b)][0] for b in range(5)), sum(stats[(r, b)][1] for b in range(5))]
        row.append(f"rank {r}{'+' if r == 3 else ''}: all {tot[1]/max(tot[0],1):.3f} (n={tot[0]})")
        for b in range(5):
            n, h = stats[(r, b)]
            if n: row.append(f"p[{b/5:.1f},{(b+1)/5:.1f}) {h/n:.3f} (n={n})")
        print("  " + " | ".join(row))
