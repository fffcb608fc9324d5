#!/usr/bin/env bash
# Train the two 4-layer refit families of the earlier head-stability table (the study now
# lives in docs/study-head-stability.md, scripts/study_head_stability.py): 5 refits with AdamW
# (weight decay 0.1) and 5 with plain Adam; results/stability-adam*.parquet are theirs.
# ~2.5 min per refit on 2 idle CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/families}
COMMON=(--n-layers 4 --d-model 64 --n-heads 4 --n-ctx 64 --seeds 0,1,2,3,4 --lr 3e-3
        --steps 1200 --batch-size 32)
.venv/bin/strata zoo train --name fam4l-adamw "${COMMON[@]}" --optimizer adamw --out-dir "$OUT/adamw"
.venv/bin/strata zoo train --name fam4l-adam "${COMMON[@]}" --optimizer adam --out-dir "$OUT/adam"
