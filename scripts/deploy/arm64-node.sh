#!/usr/bin/env bash
# An emulated 64-bit ARM board on an x86 Linux machine: a Debian Bookworm arm64 root (the userland
# of Raspberry Pi OS Bookworm, Python 3.11) run under qemu-user, with fedapp's device install, that
# joins a real SuperLink as a SuperNode. It rehearses a board before you buy or flash one.
#
# usage: arm64-node.sh build                 make the root and its venv (only what is missing)
#        arm64-node.sh node [SUPERNODE ARGS]  a SuperNode inside the root (foreground); the
#                                             arguments are start-supernode.sh's; paths given to
#                                             --ca, --key, --data-path are copied into the root
#        arm64-node.sh run CMD [ARGS...]      any command inside the root, e.g. `fedapp profile`
#        arm64-node.sh rehearse               scripts/deploy/rehearse-arm64.sh: a SuperLink with
#                                             TLS and node authentication, two x86 SuperNodes and
#                                             this one, FedKD-NAS for 3 rounds; prints its figures
#        arm64-node.sh rehearse --check       without root, qemu or a root build: its run config
#                                             and every start script's arguments, nothing started
#
# Environment:
#   FEDAPP_ARM64_ROOT     where the root lives (default ~/.cache/fedapp/arm64-bookworm); build
#                         writes ROOT.part and renames it when complete, so a root is never half-made
#   FEDAPP_ARM64_MEMORY   memory cap of everything `node` and `run` start (default 4G, a 4 GB
#                         board; `none` for no cap); cgroup v1 or v2
#   FEDAPP_ARM64_EXTRAS   the extras of the device install (default "data,board": a board that cuts
#                         a seeded shard of the run's data set; "board" alone for one with data-path)
#
# Needs root (chroot, mounts, cgroups), qemu-user-static and mmdebstrap (Debian: apt-get install
# qemu-user-static mmdebstrap), and the internet for Debian's and PyPI's packages.
#
# Emulation details a real board does not need: qemu-user has no /sys of an ARM CPU, and torch's
# CPU detection (oneDNN, cpuinfo) reads MIDR_EL1 from /sys/devices/system/cpu/cpu*/regs/
# identification/midr_el1 and crashes without it. The root therefore keeps its own /sys (the host's
# is never mounted there) holding a Cortex-A72's identification, the Raspberry Pi 4's core.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
root=${FEDAPP_ARM64_ROOT:-${XDG_CACHE_HOME:-${HOME}/.cache}/fedapp/arm64-bookworm}
memory=${FEDAPP_ARM64_MEMORY:-4G}
extras=${FEDAPP_ARM64_EXTRAS:-data,board}
suite=bookworm
mirror=http://deb.debian.org/debian
midr=0x00000000410fd083          # Cortex-A72 r0p3 (Raspberry Pi 4)
app=/opt/fedapp                  # fedapp's source and venv inside the root
node_files=/opt/fedapp-node      # what `node` copies in: CA certificate, key, data

die() { echo "arm64-node: error: $*" >&2; exit 1; }
say() { echo "arm64-node: $*" >&2; }

need_host() {
    [[ $(id -u) -eq 0 ]] || die "run as root (chroot, mounts and cgroups need it)"
    command -v mmdebstrap >/dev/null || die "mmdebstrap missing: apt-get install mmdebstrap"
    [[ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P || -x /usr/bin/qemu-aarch64-static ]] \
        || die "qemu-user-static missing: apt-get install qemu-user-static"
    if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    fi
    grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null \
        || die "binfmt_misc has no enabled qemu-aarch64 entry (update-binfmts --enable qemu-aarch64)"
}

# A fake CPU identification per host CPU (qemu-user runs the guest's threads on them).
fake_sysfs() {
    local target=$1 cpus last i ident
    cpus=$(nproc)
    last=$((cpus - 1))
    mkdir -p "${target}/sys/devices/system/cpu"
    for file in online possible present; do
        echo "0-${last}" >"${target}/sys/devices/system/cpu/${file}"
    done
    for ((i = 0; i < cpus; i++)); do
        ident="${target}/sys/devices/system/cpu/cpu${i}/regs/identification"
        mkdir -p "${ident}"
        echo "${midr}" >"${ident}/midr_el1"
        echo "0x0000000000000000" >"${ident}/revidr_el1"
    done
}

build_root() {
    [[ -d "${root}" ]] && return 0
    local part="${root}.part" start
    rm -rf "${part}"
    mkdir -p "$(dirname "${root}")"
    say "building the arm64 ${suite} root in ${root} (mmdebstrap under qemu-user: minutes)"
    start=${SECONDS}
    mmdebstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates \
        "${suite}" "${part}" "${mirror}" >&2
    fake_sysfs "${part}"
    echo "$((SECONDS - start))" >"${part}/root-build-seconds"
    mv "${part}" "${root}"
    say "root built in $((SECONDS - start)) s"
}

# What fedapp's source is, as git sees the working tree (tracked and new, not ignored).
source_files() {
    (cd "${repo}" && git ls-files -co --exclude-standard -- pyproject.toml README.md fedapp conf)
}

# Run a command inside the root: its own mount namespace (proc and /dev/shm vanish with it), the
# root's own /sys, the memory cap (a cgroup removed again when the command ends), and a clean
# environment.
in_root() {
    local cgroup="" status=0
    [[ -d "${root}" ]] || die "no root at ${root}: run '$0 build' first"
    if [[ "${memory}" != none ]]; then
        cgroup=$(make_cgroup)
        echo "${BASHPID}" >"${cgroup}/cgroup.procs"
        trap "leave_cgroup '${cgroup}'" EXIT
        trap 'exit 130' INT TERM
    fi
    unshare --mount --propagation private /bin/sh -c '
        root=$1; shift
        mount -t proc proc "$root/proc"
        mount -t tmpfs -o size=512m tmpfs "$root/dev/shm"
        exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
            PATH=/opt/fedapp/.venv/bin:/usr/local/bin:/usr/bin:/bin "$@"' \
        in-root "${root}" "$@" || status=$?
    return "${status}"
}

# Move this shell back to the parent cgroup, stop what is left in the node's, and remove it.
leave_cgroup() {
    local group=$1
    [[ -d "${group}" ]] || return 0
    echo "${BASHPID}" >"$(dirname "${group}")/cgroup.procs"
    xargs -r kill -9 <"${group}/cgroup.procs" 2>/dev/null || true
    for _ in 1 2 3 4 5; do
        rmdir "${group}" 2>/dev/null && return 0
        sleep 0.2
    done
}

# A memory cgroup for one `node` or `run` (named by this shell's PID); prints its folder.
make_cgroup() {
    local base group
    if [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
        group=/sys/fs/cgroup/memory/fedapp-arm64-$$
        mkdir -p "${group}"
        echo "${memory}" >"${group}/memory.limit_in_bytes"
    elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        base=/sys/fs/cgroup
        echo +memory >"${base}/cgroup.subtree_control" 2>/dev/null || true
        group=${base}/fedapp-arm64-$$
        mkdir -p "${group}"
        echo "${memory}" >"${group}/memory.max"
    else
        die "no memory cgroup (v1 or v2) to cap the node at ${memory}; FEDAPP_ARM64_MEMORY=none runs uncapped"
    fi
    echo "${group}"
}

# The venv is an editable install: a changed source is copied in; only a changed pyproject.toml
# or FEDAPP_ARM64_EXTRAS installs again.
install_app() {
    local wanted stamp start
    wanted="$(sha256sum "${repo}/pyproject.toml" | cut -c1-16) ${extras}"
    stamp="${root}${app}/.installed"
    rm -rf "${root}${app}.source"
    mkdir -p "${root}${app}.source"
    source_files | (cd "${repo}" && tar -cf - -T -) | tar -xf - -C "${root}${app}.source"
    if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${wanted}" ]]; then
        rm -rf "${root}${app}/fedapp" "${root}${app}/conf"
        cp -r "${root}${app}.source/." "${root}${app}/"
        rm -rf "${root}${app}.source"
        return 0
    fi
    [[ -f "${stamp}" ]] && say "the root's install ($(cut -d' ' -f2 "${stamp}")) is not the one wanted (${extras}, this pyproject.toml)"
    say "installing fedapp[${extras}] into ${root}${app} (pip under qemu-user: minutes)"
    rm -rf "${root}${app}"
    mv "${root}${app}.source" "${root}${app}"
    cp /etc/ssl/certs/ca-certificates.crt "${root}/etc/ssl/certs/ca-certificates.crt"
    start=${SECONDS}
    (FEDAPP_ARM64_MEMORY=none in_root /bin/sh -c "cd ${app} && python3 -m venv .venv \
        && .venv/bin/pip install --disable-pip-version-check -q -e '.[${extras}]'") >&2
    {
        echo "seconds $((SECONDS - start))"
        echo "packages $(FEDAPP_ARM64_MEMORY=none in_root pip list --format=freeze | wc -l)"
        echo "megabytes $(du -sm "${root}${app}/.venv" | cut -f1)"
        echo "cuda_packages $(FEDAPP_ARM64_MEMORY=none in_root pip list --format=freeze \
            | grep -ciE '^(nvidia|cuda|triton)' || true)"
    } >"${root}${app}/install-figures"
    echo "${wanted}" >"${stamp}"
    say "installed in $((SECONDS - start)) s: $(tr '\n' ' ' <"${root}${app}/install-figures")"
}

# `node`: copy the files start-supernode.sh is pointed at into the root, then start it there.
start_node() {
    local args=() name
    mkdir -p "${root}${node_files}"
    while [[ $# -gt 0 ]]; do
        case $1 in
            --ca | --key | --data-path)
                [[ -e "$2" ]] || die "$1: no such file: $2"
                name=$(basename "$2")
                cp -r "$2" "${root}${node_files}/${name}"
                args+=("$1" "${node_files}/${name}")
                shift 2
                ;;
            *) args+=("$1"); shift ;;
        esac
    done
    cp "${here}/start-supernode.sh" "${root}${node_files}/start-supernode.sh"
    in_root /bin/bash "${node_files}/start-supernode.sh" "${args[@]}"
}

command=${1:-}
[[ -n "${command}" ]] || { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
shift
case ${command} in
    build) need_host; build_root; install_app ;;
    node) need_host; build_root; install_app; start_node "$@" ;;
    run) need_host; build_root; install_app; in_root "$@" ;;
    rehearse)
        if [[ "${1:-}" == --check ]]; then  # no root, no qemu: the config and the arguments only
            exec "${here}/rehearse-arm64.sh" --check
        fi
        need_host; build_root; install_app; exec "${here}/rehearse-arm64.sh" "$@" ;;
    *) die "unknown command ${command} (build, node, run, rehearse)" ;;
esac
