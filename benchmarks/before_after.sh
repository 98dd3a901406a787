#!/usr/bin/env bash
# Before and after a change, in one sitting: two checkouts' own benchmark scripts, run in
# alternating order (A B, B A, ...) so the machine's drift falls on both alike.
#
#   bash benchmarks/before_after.sh OLD_CHECKOUT NEW_CHECKOUT [ROUNDS]
#
# Each round runs, per checkout: the realenv suite on HalfCheetah-v5 n=8 (ceiling, envmgr `step`,
# caller_envs; 1 round x 3 s) and the throughput suite on CartPole 2 x 32 (ceiling, envmgr; 2 s).
# Prints each case's per-round ratios to the ceiling of the same run, and their median.
# Needs the bench extra (mujoco). A worktree makes the old checkout:
#   git worktree add /tmp/before <commit>
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n '2,11p' "$0"; exit 2; }
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); rounds=${3:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "before: $old @ $(git -C "$old" rev-parse --short HEAD); after: $new @ $(git -C "$new" rev-parse --short HEAD)$(git -C "$new" diff --quiet HEAD || echo ' + uncommitted changes')"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg) at the start; $rounds rounds"
run() {  # run TREE SUITE ARGS...: the tree's own suite, its output kept for a failure
    local tree=$1 script=$2 how
    shift 2
    # A checkout from before benchmarks/ was a package has its suites as scripts.
    if [[ -f $tree/benchmarks/suites/$script.py ]]; then how=(-m "benchmarks.suites.$script")
    else how=("benchmarks/$script.py"); fi
    if ! (cd "$tree" && PYTHONPATH=$tree python "${how[@]}" "$@") >"$out/log" 2>&1; then
        tail -n 20 "$out/log" >&2
        echo "FAIL: $script in $tree" >&2
        exit 1
    fi
}
for r in $(seq 1 "$rounds"); do
    if ((r % 2)); then order=("$old" "$new"); else order=("$new" "$old"); fi
    for tree in "${order[@]}"; do
        tag=$([[ $tree == "$old" ]] && echo before || echo after)
        run "$tree" realenv --envs halfcheetah --n-envs 8 --impls ceiling,envmgr,envmgr-caller \
            --rounds 1 --seconds 3 --warmup 1 --no-plot --out "$out/realenv-$tag-$r"
        run "$tree" throughput --envs cartpole --n-envs 64 --impls ceiling,envmgr \
            --repeats 1 --seconds 2 --skip-extras --no-plot --out "$out/throughput-$tag-$r"
    done
done
python - "$out" <<'PY'
import glob, json, statistics, sys

out = sys.argv[1]
cases = (
    ("HalfCheetah n=8, envmgr step", "realenv", "envmgr/ceiling"),
    ("HalfCheetah n=8, caller_envs", "realenv", "envmgr-caller/ceiling"),
    ("CartPole 2 x 32, envmgr step", "throughput", "envmgr/ceiling"),
)
print(f"{'':8} {'case / ceiling':30} median  rounds")
for label, script, ratio in cases:
    for tag in ("before", "after"):
        got = []
        for path in sorted(glob.glob(f"{out}/{script}-{tag}-*/{script}.json")):
            for config in json.load(open(path))["configs"]:
                got += config["ratios"][ratio]["per_round"]
        rounds = ", ".join(f"{x:.2f}" for x in got)
        print(f"{tag:8} {label:30} {statistics.median(got):.2f}    {rounds}")
PY
