#!/usr/bin/env bash
# The paper book on a GPU machine, in slices, and its small files collected for results/.
#
#   bash scripts/gpu_kit.sh [SECONDS]      # run again until it prints "gpu_kit: complete"
#
# PRECISION=fp32|tf32|bf16 (default tf32) picks train.precision; PROFILE (default paper)
# and BOOK_DIR (default .) exist to try the kit on the CPU (tests/test_gpu_kit.py). Each call installs the
# project if it is missing (offline, from ./wheelhouse: see
# docs/offline-install.md), checks the GPU, then builds `python -m mclib book --profile
# paper` for at most SECONDS (default 540, so that a call fits a 10-minute command limit;
# 0 = no limit). The build resumes where the last call stopped: training from its newest
# checkpoint, chapters already executed are reused. Every call ends by copying the run's
# metrics, end.json, profile, scorecard, the executed chapters and their timings (never a
# checkpoint) to $OUT/results/paper-<GPU>-<DATE>/ (metrics gzipped) (OUT defaults to ./kit-out), which is
# what results/ in the repository holds once committed. docs/gpu.md has the whole recipe.
set -uo pipefail
cd "$(dirname "$0")/.."
budget="${1:-540}"
py="${PYTHON:-python3}"
out="${OUT:-kit-out}"          # where the collected results go
profile="${PROFILE:-paper}"    # the book's profile (another one only to try the kit: tests/test_gpu_kit.py)
book_dir="${BOOK_DIR:-.}"      # the book's --out-dir (runs/, book/_executed/, _build/)

if ! "$py" -c "import mclib, papermill, jupyter_book, cvxpy, distributed" 2>/dev/null; then
    if [ -d wheelhouse ]; then
        "$py" -m pip install -q --no-index --find-links wheelhouse -e . || { echo "gpu_kit: install failed" >&2; exit 3; }
    else
        "$py" -m pip install -q -e . || { echo "gpu_kit: install failed (no ./wheelhouse, no index?)" >&2; exit 3; }
    fi
fi
device=$("$py" -c "from mclib.core.config import load_profile, profile_path; print(load_profile(profile_path('$profile')).train.device)")
if [ "$device" != cpu ]; then   # only a profile pinned to the CPU may run without a GPU
    "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || { echo "gpu_kit: no CUDA device visible to torch; the $profile book needs a GPU" >&2; exit 4; }
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1

# The paper's recipe at the precision asked for (default tf32: by docs/performance.md's
# estimate strict fp32 takes ~70 min on one H100, TF32 ~22); anything but fp32 is listed
# as a departure in the book.
precision="${PRECISION:-tf32}"
mkdir -p "$out"
"$py" - "$precision" "$profile" "$out/$profile.yaml" <<'PY' || exit 2
import sys, yaml
from mclib.core.config import load_profile, profile_path
p = load_profile(profile_path(sys.argv[2])).replace(**{"train.precision": sys.argv[1]})
open(sys.argv[3], "w").write(yaml.safe_dump(p.to_dict(), sort_keys=False))
PY
start=$(date +%s)
if [ "$budget" = 0 ]; then
    "$py" -m mclib book --profile "$out/$profile.yaml" --out-dir "$book_dir" --quiet; rc=$?
else
    timeout --signal=INT --kill-after=30 "$budget" "$py" -m mclib book --profile "$out/$profile.yaml" \
        --out-dir "$book_dir" --quiet; rc=$?
fi
echo "gpu_kit: book exit $rc after $(( $(date +%s) - start )) s"
dest=$("$py" - "$out" "$book_dir" "$profile" <<'PY'
import sys, time
from pathlib import Path
from mclib.book.reference import collect, device_record
from mclib.core.config import load_profile, profile_path
out, book_dir, profile = sys.argv[1:4]
name = load_profile(profile_path(profile)).name
gpu = device_record()["device"].replace(" ", "-")
dest = Path(out) / "results" / f"{name}-{gpu}-{time.strftime('%Y-%m-%d')}"
print(collect(book_dir, dest, name=name))
PY
)
echo "gpu_kit: collected into $dest"
if [ "$rc" = 0 ]; then echo "gpu_kit: complete"; else echo "gpu_kit: not finished (exit $rc): call again to continue"; fi
exit "$rc"
