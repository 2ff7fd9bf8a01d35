#!/usr/bin/env bash
# Start a Flower SuperNode (one per device) for fedapp; runs in the foreground (Ctrl-C stops it).
#
# usage: start-supernode.sh --superlink HOST:PORT --partition-id I --num-partitions N
#                           [--budget MACS] [--data-path PATH] [--port PORT]
#                           (--ca CA_CERT [--key PRIVATE_KEY] | --insecure) [--check]
#                           [-- EXTRA_FLOWER_ARGS...]
#   --partition-id    this device's index, an integer 0..N-1, unique in the federation
#   --num-partitions  N, a positive integer equal to the run config's num-clients
#   --budget          compute budget in MACs (see `fedapp profile`), a positive number as
#                     `fedapp` takes it: 48000000, 4.8e7, 48M, 1.5G (k, M, G: 10^3, 10^6, 10^9);
#                     default: seeded draw
#   --data-path       train on this device's own data (.npz file or image folder) instead of a
#                     seeded shard of the run's data set
#   --port            local port for the SuperNode's ClientApp API (default 9094; give each
#                     SuperNode on one machine its own)
#   --ca              the SuperLink's CA certificate (TLS); --key: identity for node auth
#   --insecure        no TLS: for a trusted LAN only
#   --check           check the arguments, print the flower-supernode command and exit
# Every value is checked here, before anything starts, with an error naming it.
# The SuperNode reconnects by itself when the SuperLink restarts or the link drops.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

# A MAC count as `fedapp` parses one (fedapp.tools.cli.parse_macs), printed as a plain number.
macs() {
    local text=${1,,} number suffix value
    [[ "${text}" =~ ^([0-9]*\.?[0-9]+(e[0-9]+)?)([kmg]?)$ ]] \
        || die "--budget ${1}: not a MAC count (e.g. 48000000, 4.8e7, 48M, 1.5G)"
    number=${BASH_REMATCH[1]}
    suffix=${BASH_REMATCH[3]}
    value=$(awk -v n="${number}" -v s="${suffix}" 'BEGIN {
        m = (s == "k") ? 1e3 : (s == "m") ? 1e6 : (s == "g") ? 1e9 : 1
        v = n * m
        if (v <= 0 || v > 1e300) exit 1
        printf "%.17g", v }') \
        || die "--budget ${1}: must be a positive, finite number of MACs"
    echo "${value}"
}

superlink=""
partition_id=""
num_partitions=""
budget=""
data_path=""
port=9094
ca=""
key=""
insecure=0
check=0
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --superlink | --partition-id | --num-partitions | --budget | --data-path | --port | --ca | --key)
            [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
            case $1 in
                --superlink) superlink=$2 ;;
                --partition-id) partition_id=$2 ;;
                --num-partitions) num_partitions=$2 ;;
                --budget) budget=$2 ;;
                --data-path) data_path=$2 ;;
                --port) port=$2 ;;
                --ca) ca=$2 ;;
                --key) key=$2 ;;
            esac
            shift 2
            ;;
        --insecure) insecure=1; shift ;;
        --check) check=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option $1 (see the header of $0)" ;;
    esac
done
if [[ -z "${superlink}" || -z "${partition_id}" || -z "${num_partitions}" ]]; then
    die "--superlink, --partition-id and --num-partitions are required"
fi
[[ "${superlink}" =~ ^[^[:space:]]+:[0-9]+$ ]] \
    || die "--superlink ${superlink}: expected HOST:PORT, e.g. 192.168.1.10:9092"
[[ "${num_partitions}" =~ ^[0-9]+$ ]] && ((10#${num_partitions} >= 1)) \
    || die "--num-partitions ${num_partitions}: expected a positive integer (the run's num-clients)"
[[ "${partition_id}" =~ ^[0-9]+$ ]] \
    || die "--partition-id ${partition_id}: expected an integer 0..$((10#${num_partitions} - 1))"
((10#${partition_id} < 10#${num_partitions})) \
    || die "--partition-id ${partition_id} is outside 0..$((10#${num_partitions} - 1)) (--num-partitions ${num_partitions})"
[[ "${port}" =~ ^[0-9]+$ ]] && ((10#${port} >= 1 && 10#${port} <= 65535)) \
    || die "--port ${port}: expected a port number 1..65535"

node_config="partition-id=$((10#${partition_id})) num-partitions=$((10#${num_partitions}))"
if [[ -n "${budget}" ]]; then
    node_config+=" budget=$(macs "${budget}")"
fi
if [[ -n "${data_path}" ]]; then
    if [[ "${data_path}" =~ [[:space:]\"\'] ]]; then
        echo "error: --data-path must not contain spaces or quotes: ${data_path}" >&2
        exit 2
    fi
    [[ -e "${data_path}" ]] || { echo "error: no data at ${data_path}" >&2; exit 1; }
    data_path=$(cd "$(dirname "${data_path}")" && pwd)/$(basename "${data_path}")
    node_config+=" data-path=\"${data_path}\""
fi

args=(--superlink "${superlink}" --port "${port}" --node-config "${node_config}")
if [[ -n "${ca}" ]]; then
    [[ -f "${ca}" ]] || { echo "error: no CA certificate at ${ca}" >&2; exit 1; }
    args+=(--root-certificates "${ca}")
    if [[ -n "${key}" ]]; then
        [[ -f "${key}" ]] || { echo "error: no private key at ${key}" >&2; exit 1; }
        args+=(--auth-supernode-private-key "${key}")
    fi
elif [[ ${insecure} -eq 1 ]]; then
    [[ -z "${key}" ]] || { echo "error: --key (node authentication) needs TLS (--ca)" >&2; exit 2; }
    args+=(--insecure)
else
    die "give --ca CA_CERT for TLS, or --insecure on a trusted LAN"
fi
if [[ ${check} -eq 1 ]]; then
    echo flower-supernode "${args[@]}" "${extra[@]}"
    exit 0
fi
exec flower-supernode "${args[@]}" "${extra[@]}"
