# Which routing decisions of the CPU oracle are near-ties, and do the clusters of CPU-vs-HF logit
# error start at them?
import csv, sys, collections
trace, csvp, npos = sys.argv[1], sys.argv[2], int(sys.argv[3])
gaps = collections.defaultdict(list)   # pos -> [(lgap, layer)]
for line in open(trace):
    f = line.split()
    layer, pos, lgap = int(f[0]), int(f[1]), float(f[4])
    gaps[pos].append((lgap, layer))
rows = list(csv.DictReader(open(csvp)))
over = [int(r['pos']) for r in rows if int(r['pos']) < npos and float(r['cpu-f32_nle']) > 1e-4]
# cluster starts: positions over 1e-4 whose previous 3 positions are not
starts = [p for p in over if not any(q in over for q in range(p - 3, p))]
print("positions over 1e-4 (first %d):" % npos, over)
print("cluster starts:", starts)
allmin = sorted((min(g)[0], p, min(g)[1]) for p, g in gaps.items())
print("smallest logit gaps (8th - 9th) anywhere: ", [(f"{g:.2e}", p, l) for g, p, l in allmin[:15]])
for p in starts:
    g, l = min(gaps[p])
    rank = sum(1 for x in allmin if x[0] < g)
    print(f"start {p}: smallest gap {g:.3e} (layer {l}), rank {rank} of {len(allmin)} positions")
