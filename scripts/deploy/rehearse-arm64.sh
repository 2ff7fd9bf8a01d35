#!/usr/bin/env bash
# The emulated board's rehearsal (run it as `scripts/deploy/arm64-node.sh rehearse`, which builds
# what is missing first): on 127.0.0.1, a SuperLink with TLS and SuperNode authentication, two x86
# SuperNodes from this machine's fedapp install and one aarch64 SuperNode in the emulated root
# (memory capped like a 4 GB board), FedKD-NAS on mnist-5k for 3 rounds. It prints, and writes
# to WORK/rehearsal.md: the install in the root, `fedapp profile` natively and emulated on one
# fixed workload, the ClientApp's import time, the run's per-round time, and the aarch64 node's
# work per round and peak memory. Everything it starts is stopped by PID when it ends.
#
# usage: rehearse-arm64.sh [--check]
#   --check: without qemu or a root, write the run config and read it back as Flower and fedapp
#            do, make the certificates and keys, and check every start script's arguments
#            (start-*.sh --check); nothing is started.
# Environment: FEDAPP_REHEARSAL_DIR (default a new /tmp/fedapp-rehearsal.XXXX), FEDAPP_VENV (the
# x86 side's virtual environment, default the repository's .venv), FEDAPP_REHEARSAL_ROUNDS (3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
root=${FEDAPP_ARM64_ROOT:-${XDG_CACHE_HOME:-${HOME}/.cache}/fedapp/arm64-bookworm}
venv=${FEDAPP_VENV:-${repo}/.venv}
rounds=${FEDAPP_REHEARSAL_ROUNDS:-3}
export PATH="${venv}/bin:${PATH}"
# Nodes on one machine share its cores: one torch thread each, as in the deployment tests
export OMP_NUM_THREADS=1 FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1
# budgets in MACs: LeNet5 x2.0 (1.43M), x1.0 (417k), x0.5 (134k) are the largest they afford
budgets=(1500000 500000 150000)
names=(x86-0 x86-1 arm64-0)

say() { echo "rehearsal: $*" >&2; }
die() { echo "rehearsal: error: $*" >&2; exit 1; }

check=0
case ${1:-} in
    "") ;;
    --check) check=1 ;;
    *) die "unknown argument $1 (--check or nothing)" ;;
esac

command -v flower-superlink >/dev/null || die "no flower-superlink in ${venv}/bin (FEDAPP_VENV)"
[[ ${check} -eq 1 ]] || grep -q data "${root}/opt/fedapp/.installed" 2>/dev/null \
    || die "the root's install lacks the data extra that a node cutting a seeded shard needs: \
FEDAPP_ARM64_EXTRAS=data,board $here/arm64-node.sh build"

work=${FEDAPP_REHEARSAL_DIR:-$(mktemp -d /tmp/fedapp-rehearsal.XXXX)}
mkdir -p "${work}"
work=$(cd "${work}" && pwd)
pids=()
arm_pid=""
cleanup() {
    local pid group
    for pid in "${pids[@]}"; do
        kill -- "-${pid}" 2>/dev/null || true
    done
    if [[ -n "${arm_pid}" ]]; then
        for group in /sys/fs/cgroup/memory/fedapp-arm64-"${arm_pid}" \
            /sys/fs/cgroup/fedapp-arm64-"${arm_pid}"; do
            [[ -d "${group}" ]] || continue
            xargs -r kill -9 <"${group}/cgroup.procs" 2>/dev/null || true
            sleep 1
            rmdir "${group}" 2>/dev/null || true
        done
    fi
    sleep 1
    for pid in "${pids[@]}"; do
        kill -9 -- "-${pid}" 2>/dev/null || true
    done
}
trap cleanup EXIT

free_port() {
    python -c 'from fedapp.tools.launcher import free_port; print(free_port())'
}

# start NAME CMD...: in its own session (its PID is its group), output to WORK/NAME.log
start() {
    local name=$1
    shift
    setsid "$@" >"${work}/${name}.log" 2>&1 </dev/null &
    pids+=($!)
    echo $!
}

import_seconds='import time; t = time.perf_counter(); import fedapp.apps.client_app; print(f"{time.perf_counter() - t:.1f}")'

# The run config, written and read back as Flower and fedapp will read it, before anything starts.
write_config() {
    python - "${repo}/conf/fedkd-nas-mnist5k.toml" "${work}/run.toml" "${work}/out" "${rounds}" <<'EOF'
import sys, tomllib
from pathlib import Path
from flwr.common.config import get_fused_config_from_dir, parse_config_args
from fedapp.run.config import parse_run_config
from fedapp.tools.launcher import APP_DIR, write_run_config
preset, target, out, rounds = sys.argv[1:]
config = tomllib.loads(Path(preset).read_text()) | {
    "num-clients": 3, "fraction-train": 1.0, "num-server-rounds": int(rounds),
    "run-name": "arm64-rehearsal", "out-dir": out,
    "node-wait-timeout": 1800.0,  # the emulated node takes minutes to import and profile
    "round-timeout": 3600.0,
    "fleet": {"clock": "wall"},  # real devices: the rounds' measured time is the fleet's
}
write_run_config(Path(target), config)
parse_run_config(get_fused_config_from_dir(APP_DIR, parse_config_args([target])))
EOF
}

say "work folder ${work}"
write_config
if [[ ${check} -eq 1 ]]; then
    say "--check: certificates, keys and every start script's arguments, nothing started"
    "${here}/make-certs.sh" "${work}/certs" >/dev/null
    for name in "${names[@]}"; do
        "${here}/make-node-key.sh" "${work}/keys" "${name}" >/dev/null
    done
    "${here}/start-superlink.sh" --host 127.0.0.1 --port 9092 --certs "${work}/certs" \
        --node-auth --database "${work}/superlink.db" --check
    for i in 0 1 2; do
        "${here}/start-supernode.sh" --superlink 127.0.0.1:9092 --partition-id "${i}" \
            --num-partitions 3 --budget "${budgets[i]}" --port "$((9094 + i))" \
            --ca "${work}/certs/ca.crt" --key "${work}/keys/${names[i]}" --check
    done
    say "check passed: ${work}/run.toml is a run config Flower and fedapp accept"
    exit 0
fi
say "fedapp profile, natively and emulated (one thread, 20 s each)"
fedapp profile --seconds 20 --json >"${work}/profile-x86_64.json"
"${here}/arm64-node.sh" run env OMP_NUM_THREADS=1 fedapp profile --seconds 20 --json \
    >"${work}/profile-aarch64.json"
say "import of the ClientApp, natively and emulated"
python -c "${import_seconds}" >"${work}/import-x86_64.txt"
"${here}/arm64-node.sh" run python -c "${import_seconds}" >"${work}/import-aarch64.txt"

say "certificates, node keys, SuperLink with TLS and node authentication"
"${here}/make-certs.sh" "${work}/certs" >/dev/null
for name in "${names[@]}"; do
    "${here}/make-node-key.sh" "${work}/keys" "${name}" >/dev/null
done
port=$(free_port)
start superlink env FLWR_HOME="${work}/superlink-home" "${here}/start-superlink.sh" \
    --host 127.0.0.1 --port "${port}" --certs "${work}/certs" --node-auth \
    --database "${work}/superlink.db" >/dev/null
for _ in $(seq 100); do
    (echo >"/dev/tcp/127.0.0.1/${port}") 2>/dev/null && break
    sleep 0.2
done
export FLWR_HOME="${work}/flwr-home"
"${here}/add-connection.sh" rehearsal "127.0.0.1:${port}" "${work}/certs/ca.crt" >/dev/null
for name in "${names[@]}"; do
    flwr supernode register "${work}/keys/${name}.pub" rehearsal >"${work}/register-${name}.log"
done

say "SuperNodes: ${names[*]} (budgets ${budgets[*]} MACs)"
for i in 0 1; do
    start "${names[i]}" env FLWR_HOME="${work}/${names[i]}-home" "${here}/start-supernode.sh" \
        --superlink "127.0.0.1:${port}" --partition-id "${i}" --num-partitions 3 \
        --budget "${budgets[i]}" --port "$(free_port)" \
        --ca "${work}/certs/ca.crt" --key "${work}/keys/${names[i]}" >/dev/null
done
arm_pid=$(start "${names[2]}" "${here}/arm64-node.sh" node \
    --superlink "127.0.0.1:${port}" --partition-id 2 --num-partitions 3 \
    --budget "${budgets[2]}" --port "$(free_port)" \
    --ca "${work}/certs/ca.crt" --key "${work}/keys/${names[2]}")
pids+=("${arm_pid}") # started in a subshell, which kept its own list

say "flwr run: FedKD-NAS on mnist-5k, ${rounds} rounds (the emulated node makes it minutes)"
started=${SECONDS}
(cd "${repo}" && timeout 5400 flwr run . rehearsal --stream --run-config "${work}/run.toml") \
    >"${work}/flwr-run.log" 2>&1 || true
run_seconds=$((SECONDS - started))
[[ -f "${work}/out/arm64-rehearsal/summary.json" ]] \
    || die "the run left no summary.json; see ${work}/flwr-run.log and ${work}/*.log"

peak=""
for group in /sys/fs/cgroup/memory/fedapp-arm64-"${arm_pid}" /sys/fs/cgroup/fedapp-arm64-"${arm_pid}"; do
    for file in memory.max_usage_in_bytes memory.peak; do
        [[ -f "${group}/${file}" ]] && peak=$(cat "${group}/${file}")
    done
done

python - "${work}" "${root}" "${run_seconds}" "${peak}" <<'EOF' | tee "${work}/rehearsal.md"
import json, sys
from pathlib import Path
from fedapp.results import load_run
work, root, run_seconds, peak = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
run = load_run(work / "out" / "arm64-rehearsal")
install = dict(line.split() for line in (root / "opt/fedapp/install-figures").read_text().splitlines())
build = (root / "root-build-seconds").read_text().strip()
native, emulated = (json.loads((work / f"profile-{m}.json").read_text()) for m in ("x86_64", "aarch64"))
imports = {m: (work / f"import-{m}.txt").read_text().strip() for m in ("x86_64", "aarch64")}
print("## Emulated aarch64 SuperNode: rehearsal\n")
print(f"root (mmdebstrap, once): {build} s; device install in it ({(root / 'opt/fedapp/.installed').read_text().split()[-1]}): "
      f"{install['packages']} packages, {install['megabytes']} MB, {int(install['seconds']) / 60:.1f} min, "
      f"{install['cuda_packages']} CUDA/NVIDIA/triton packages")
print("\n| | x86_64 (this machine) | aarch64 (emulated) | emulated / native |\n|---|---|---|---|")
rate = [p["macs_per_second"] for p in (native, emulated)]
print(f"| fedapp profile, 1 thread: GMAC/s of training | {rate[0] / 1e9:.2f} | {rate[1] / 1e9:.3f} | 1/{rate[0] / rate[1]:.0f} |")
print(f"| torch | {native['host']['torch']} | {emulated['host']['torch']} | |")
print(f"| import of the ClientApp (s) | {imports['x86_64']} | {imports['aarch64']} | |")
print(f"\nrun: {run.strategy} on {run.summary['dataset']}, {run.summary['rounds']} rounds, "
      f"{run_seconds} s with flwr run; test {100 * run.test_accuracy:.2f}%")
print("\n| node | partition | budget (MACs) | examples |\n|---|---|---|---|")
for node in run.summary["node_profiles"]:
    print(f"| {node['device']} | {node['partition']} | {node['budget']:,.0f} | {node['examples']} |")
print("\n| round | seconds |\n|---|---|")
for _, row in run.metrics.iterrows():
    print(f"| {int(row['round'])} | {row['seconds']:.1f} |")
print("\n| device | client-rounds | local work per round, mean (s) | longest (s) | ClientApp peak RSS (MB) |\n|---|---|---|---|---|")
for device, work_ in run.summary["work_by_device"].items():
    print(f"| {device} | {work_['client_rounds']} | {work_['seconds_mean']:.1f} | {work_['seconds_max']:.1f} | {work_['peak_rss_mb_max']:,.0f} |")
if peak:
    print(f"\npeak memory of everything the emulated node ran (its cgroup, qemu included): {int(peak) / 2**20:,.0f} MB")
EOF
say "figures in ${work}/rehearsal.md; the run in ${work}/out/arm64-rehearsal"
