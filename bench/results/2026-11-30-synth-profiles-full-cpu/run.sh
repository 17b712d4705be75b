#!/usr/bin/env bash
# full-shape conditioning on the CPU: bf16 KV vs fp32 KV, per profile
set -u
B=/work/wt-i13/build/calla
for p in trained uniform; do
  d=/tmp/i13full/full-$p
  /usr/bin/time -f "synth $p %e s, rss %M KB" $B synth --geometry full --seed 1 --profile $p --threads 2 --out $d
  /usr/bin/time -f "score $p f32 %e s, rss %M KB" $B score --model $d --tokens seq33.txt --backend cpu --kv-f32 --threads 2 --json f32-$p.json
  /usr/bin/time -f "score $p bf16 %e s, rss %M KB" $B score --model $d --tokens seq33.txt --backend cpu --threads 2 --reference f32-$p.json --json bf16-$p.json
  rm -rf $d
done
echo ALLDONE
