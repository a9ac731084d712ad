#!/usr/bin/env bash
# A smoke test of dpro on a machine with a GPU: every step a user takes, on real CUDA kernels,
# NCCL and NVML, in a few minutes. It also runs where there is no GPU (torchrun's job then uses
# gloo and the CPU, and NVML is reported absent), which is how it is rehearsed.
#
#   OUT=/tmp/gpu-out bash benchmarks/gpu_check.sh          # from the repository's root
#
# What it checks, each step echoed with its exit code and seconds, under a time limit:
#   0. the machine: nvidia-smi, torch, CUDA, NCCL, the GPU torch sees;
#   1. a DDP job (examples/train_lm.py) on one GPU: `dpro record` (its calibration: where it ran,
#      and any error dpro's hooks logged), then `info`, `replay`
#      (measured against predicted step time), `critical-path`, two what-ifs (faster links;
#      operator fusion, which changes the kernels) and `optimize` (a short search);
#   2. the FSDP2 job (examples/train_parallel.py --form fsdp) on one GPU: `dpro record`,
#      `replay`, `critical-path`, the what-if of keeping units gathered after forward, and
#      dpro's memory estimate (dpro.analysis.memory.rank_memory: held + the step's peak added)
#      against torch.cuda.max_memory_allocated of the same job (read by a wrapper that runs
#      the unchanged example with runpy, then writes the allocator's peak);
#   3. `dpro health` on this node alone with the real NVML (small collective sizes), and its
#      per-node checks, and the node-problem-detector one-liner (`--npd`).
# A failing step does not stop the others; the script exits 1 if any step failed.
#
# Output, in $OUT: gpu_check.log (everything printed), steps.tsv (step, exit code, seconds),
# runs.tar.gz (the run directories without dpro's cache, health.json/md and the optimizer's
# report; the traces too unless that makes it too large), to analyse the recordings elsewhere.
#
# Environment: PYTHON (default python3: the one holding a CUDA torch), WHEELS (a folder of
# wheels for dpro's dependencies missing on the machine, default .whl; installed only if some
# are missing), SITE (where dpro and those wheels are installed, default /tmp/gpu_check/site),
# STEP_TIMEOUT (seconds each step may take, default 120).

set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$(mktemp -d /tmp/gpu-check-out.XXXX)}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
WORK=/tmp/gpu_check
SITE=${SITE:-$WORK/site}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
export PYTHONUNBUFFERED=1

REPO=$PWD
DPRO=("$PYTHON" -m dpro)
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1)

# step NAME COMMAND...: echo the command, run it under the time limit, log its exit code and time.
step() {
    local name=$1 t0=$SECONDS rc
    shift
    echo
    echo "=== [$name] + $*"
    timeout -k 10 "$STEP_TIMEOUT" "$@"
    rc=$?
    echo "=== [$name] rc=$rc ($((SECONDS - t0)) s)$([ $rc = 124 ] && echo ", timed out after ${STEP_TIMEOUT} s")"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
    [ $rc = 0 ] || FAILED=1
    return $rc
}

mkdir -p "$OUT"

main() {
rm -rf "$WORK" && mkdir -p "$WORK"
printf 'step\trc\tseconds\n' > "$OUT/steps.tsv"
FAILED=0

# --- install: the missing dependencies as wheels, then dpro itself ------------------------------
echo "=== install"
mkdir -p "$SITE/deps" "$SITE/dpro"
if ! "$PYTHON" -c "import msgspec, isal, sqlalchemy, alembic, plotly" 2>/dev/null; then
    # only those missing here: dask/distributed (--scheduler) and dash (the dashboard) are not used
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE/deps" "$WHEELS"/*.whl || { echo "could not install the wheels in $WHEELS"; exit 3; }
fi
# The package maps top-level folders (collectors/, graph/, ...) onto dpro.*: install it (from a
# copy, pip building in-tree), which needs setuptools >= 77 here; failing that, build the same
# layout as a tree of links.
mkdir -p "$WORK/src"
tar cf - --exclude=./.venv --exclude=./.whl --exclude=./.git --exclude=./test-artifacts . | tar xf - -C "$WORK/src"
if ! (cd "$WORK/src" && "$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target "$SITE/dpro" .); then
    echo "pip could not install dpro: linking the source tree into $SITE/dpro/dpro instead"
    rm -rf "$SITE/dpro/dpro" && cp -rs "$REPO/dpro" "$SITE/dpro/dpro"
    for sub in collectors graph replayer optimizer anomaly dashboard examples; do
        ln -s "$REPO/$sub" "$SITE/dpro/dpro/$sub"
    done
fi
export PYTHONPATH="$SITE/dpro:$SITE/deps${PYTHONPATH:+:$PYTHONPATH}"
# From here on, outside the checkout: there, `import dpro` would find its source folder dpro/,
# which lacks the subpackages that live in top-level folders.
cd "$WORK"
step dpro-version "${DPRO[@]}" --version || exit 3
"$PYTHON" -c "import dpro.graph; print('dpro imported from', dpro.__file__)" || exit 3

# --- 0. the machine ------------------------------------------------------------------------------
echo
echo "=== machine"
uname -a
nproc
nvidia-smi || echo "nvidia-smi: not found or failed"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null
"$PYTHON" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU 0:", p.name, f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs,",
          f"capability {p.major}.{p.minor}; NCCL", ".".join(map(str, torch.cuda.nccl.version())))
else:
    print("no CUDA device: the jobs run on the CPU with gloo")
EOF
GPU=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))")

# The model: the examples' defaults on the CPU (a quick rehearsal); on a GPU one large enough
# that its kernels, not their launches, take most of a step.
if [ "$GPU" = 1 ]; then
    SIZE=(--d-model 512 --layers 6 --heads 8 --batch-size 32 --seq-len 128)
else
    SIZE=()
fi

# Runs the example named first with its arguments, unchanged (runpy), then writes the CUDA
# allocator's peak of this rank to $PEAK_MEMORY_OUT.<rank>.json.
cat > "$WORK/peak_memory.py" <<'EOF'
import json, os, runpy, sys

script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
try:
    runpy.run_path(script, run_name="__main__")
finally:
    import torch
    rank = int(os.environ.get("RANK", 0))
    peak = {"rank": rank, "cuda": torch.cuda.is_available()}
    if peak["cuda"]:
        peak.update(device=torch.cuda.get_device_name(), max_memory_allocated=torch.cuda.max_memory_allocated(),
                    max_memory_reserved=torch.cuda.max_memory_reserved())
    with open(f"{os.environ['PEAK_MEMORY_OUT']}.{rank}.json", "w") as f:
        json.dump(peak, f)
EOF

# Prints dpro's memory estimate of every rank of run $1 beside the allocator's peak in $2.<rank>.json.
cat > "$WORK/compare_memory.py" <<'EOF'
import json, os, sys
from dpro.analysis.memory import rank_memory
from dpro.analysis.run import RunAnalysis

run, peaks = sys.argv[1], sys.argv[2]
MB = 2**20
for rank, m in sorted(rank_memory(RunAnalysis.open(run)).items()):
    print(f"rank {rank} dpro estimate ({m.device}): parameters {m.parameters_bytes / MB:.1f} MiB, gradients "
          f"{m.gradients_bytes / MB:.1f}, buckets {m.buckets_bytes / MB:.1f} (as bucket view: "
          f"{m.gradient_as_bucket_view}), optimizer state {m.optimizer_state_bytes / MB:.1f}; held "
          f"{m.held_bytes / MB:.1f} MiB + the step's peak added "
          f"{'?' if m.added_bytes is None else f'{m.added_bytes / MB:.1f}'} MiB = {m.peak_bytes / MB:.1f} MiB")
    path = f"{peaks}.{rank}.json"
    peak = json.load(open(path)) if os.path.exists(path) else {}
    if peak.get("cuda"):
        alloc = peak["max_memory_allocated"]
        print(f"rank {rank} torch.cuda.max_memory_allocated {alloc / MB:.1f} MiB (reserved "
              f"{peak['max_memory_reserved'] / MB:.1f} MiB) on {peak['device']}: dpro's estimate is "
              f"{100 * (m.peak_bytes / alloc - 1):+.1f}% of it")
    else:
        print(f"rank {rank}: no CUDA peak to compare with ({path}: {peak or 'missing'})")
EOF

# Prints what the calibration of run $1 measured (where, how many sizes, the profiler's price) and
# the errors dpro's hooks logged in the job.
cat > "$WORK/calibration.py" <<'EOF'
import json, sys
from pathlib import Path

failed = False
for rank_dir in sorted(Path(sys.argv[1], "ranks").iterdir()):
    path = rank_dir / "calibration.json"
    c = json.loads(path.read_text()) if path.exists() else {}
    coll, prof = c.get("collectives") or {}, c.get("profiler") or {}
    print(f"rank {rank_dir.name}: collectives on {coll.get('device', '?')}: {len(coll.get('collectives') or [])} sizes"
          f" timed, notes {coll.get('notes')}, error {coll.get('error', '-')}; interference "
          f"{sorted((coll.get('interference') or {}).keys()) or '-'}; profiler on {prof.get('device', '?')}: per event "
          f"forward {(prof.get('forward') or {}).get('per_event_ns')} ns, backward "
          f"{(prof.get('backward') or {}).get('per_event_ns')} ns")
    errors = rank_dir / "errors.log"
    if errors.exists() and errors.stat().st_size:
        failed = True
        print(errors.read_text()[-3000:])
    else:
        print(f"rank {rank_dir.name}: no error logged")
sys.exit(1 if failed else 0)
EOF

# --- 1. DDP: examples/train_lm.py on one GPU -----------------------------------------------------
RUN=$WORK/ddp-run
step record-ddp env PEAK_MEMORY_OUT="$WORK/ddp-peak" \
    "${DPRO[@]}" record -o "$RUN" -- "${TORCHRUN[@]}" \
    "$WORK/peak_memory.py" "$REPO/examples/train_lm.py" --steps 30 "${SIZE[@]}"
step calibration-ddp "$PYTHON" "$WORK/calibration.py" "$RUN"
step info-ddp "${DPRO[@]}" info "$RUN"
step replay-ddp "${DPRO[@]}" replay "$RUN"
step critical-path-ddp "${DPRO[@]}" critical-path "$RUN" --top 10
step whatif-ddp-bandwidth "${DPRO[@]}" whatif "$RUN" --bandwidth-scale 2
step whatif-ddp-fuse-ops "${DPRO[@]}" whatif "$RUN" --fuse-ops
step optimize-ddp "${DPRO[@]}" optimize "$RUN" --budget 30 -o "$WORK/ddp-optimize"
step memory-ddp "$PYTHON" "$WORK/compare_memory.py" "$RUN" "$WORK/ddp-peak"

# --- 2. FSDP2: examples/train_parallel.py --form fsdp on one GPU ---------------------------------
RUN2=$WORK/fsdp-run
step record-fsdp env PEAK_MEMORY_OUT="$WORK/fsdp-peak" \
    "${DPRO[@]}" record -o "$RUN2" -- "${TORCHRUN[@]}" \
    "$WORK/peak_memory.py" "$REPO/examples/train_parallel.py" --form fsdp --steps 20 "${SIZE[@]}"
step calibration-fsdp "$PYTHON" "$WORK/calibration.py" "$RUN2"
step info-fsdp "${DPRO[@]}" info "$RUN2"
step replay-fsdp "${DPRO[@]}" replay "$RUN2"
step critical-path-fsdp "${DPRO[@]}" critical-path "$RUN2" --top 10
step whatif-fsdp-no-reshard "${DPRO[@]}" whatif "$RUN2" --no-reshard-after-forward
step memory-fsdp "$PYTHON" "$WORK/compare_memory.py" "$RUN2" "$WORK/fsdp-peak"

# --- 3. dpro health on this node alone (real NVML where there is a GPU) ------------------------
cat > "$WORK/health.yaml" <<'EOF'
collectives:
  sizes_mb: [1, 16]
  iterations: 5
pairwise:
  megabytes: 1
  seconds: 0.2
EOF
HEALTH=$WORK/health
# exit codes of dpro health: 0 healthy, 1 degraded, 2 failed, 3 could not run
step health "${DPRO[@]}" health --nproc 1 --config "$WORK/health.yaml" --db "sqlite:///$WORK/health.db" -o "$HEALTH"
step health-nodes "$PYTHON" - "$HEALTH/health.json" <<'EOF'
import json, sys

report = json.load(open(sys.argv[1]))
print("verdict:", report["verdict"], "| backend", report["backend"], "| hosts", report["hosts"])
for node in report["nodes"]:
    print(f"node {node['host']}: {node['verdict']}")
    for check in node["checks"]:
        metrics = ", ".join(f"{m['name']}={m['value']:.4g}{' ' + m['unit'] if m['unit'] else ''}" for m in check["metrics"])
        print(f"  {check['name']:28s} {check['status']:5s} {metrics} {check['message']}")
EOF
step health-npd "${DPRO[@]}" health --npd --db "sqlite:///$WORK/health.db"

# --- what comes back -------------------------------------------------------------------------
cd "$WORK"
TAR=(ddp-run fsdp-run health ddp-optimize ./*-peak.*.json health.yaml)
tar czf "$OUT/runs.tar.gz" --exclude='*.html' --exclude=derived "${TAR[@]}" 2>/dev/null
if [ "$(stat -c %s "$OUT/runs.tar.gz")" -gt $((15 * 2**20)) ]; then
    echo "runs.tar.gz over 15 MiB: leaving the traces out"
    tar czf "$OUT/runs.tar.gz" --exclude='*.html' --exclude=derived --exclude='trace*.json.gz' "${TAR[@]}" 2>/dev/null
fi
ls -l "$OUT"
echo
column -t "$OUT/steps.tsv" 2>/dev/null || cat "$OUT/steps.tsv"
echo "=== gpu_check: $([ $FAILED = 0 ] && echo 'every step passed' || echo 'some steps FAILED')"
return $FAILED
}

main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
