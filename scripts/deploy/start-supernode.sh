#!/usr/bin/env bash
# Start a Flower SuperNode (one per device) for fedapp; runs in the foreground (Ctrl-C stops it).
#
# usage: start-supernode.sh --superlink HOST:PORT --partition-id I --num-partitions N
#                           [--budget MACS] [--data-path PATH] [--port PORT]
#                           (--ca CA_CERT [--key PRIVATE_KEY] | --insecure) [-- EXTRA_FLOWER_ARGS...]
#   --partition-id    this device's index, 0..N-1, unique in the federation
#   --num-partitions  N, equal to the run config's num-clients
#   --budget          compute budget in MACs (see `fedapp profile`); default: seeded draw
#   --data-path       train on this device's own data (.npz file or image folder) instead of a
#                     seeded shard of the run's data set
#   --port            local port for the SuperNode's ClientApp API (default 9094; give each
#                     SuperNode on one machine its own)
#   --ca              the SuperLink's CA certificate (TLS); --key: identity for node auth
#   --insecure        no TLS: for a trusted LAN only
# The SuperNode reconnects by itself when the SuperLink restarts or the link drops.
set -euo pipefail

superlink=""
partition_id=""
num_partitions=""
budget=""
data_path=""
port=9094
ca=""
key=""
insecure=0
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --superlink) superlink=$2; shift 2 ;;
        --partition-id) partition_id=$2; shift 2 ;;
        --num-partitions) num_partitions=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --data-path) data_path=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --ca) ca=$2; shift 2 ;;
        --key) key=$2; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
if [[ -z "${superlink}" || -z "${partition_id}" || -z "${num_partitions}" ]]; then
    echo "error: --superlink, --partition-id and --num-partitions are required" >&2
    exit 2
fi

node_config="partition-id=${partition_id} num-partitions=${num_partitions}"
if [[ -n "${budget}" ]]; then
    node_config+=" budget=${budget}"
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
    echo "error: give --ca CA_CERT for TLS, or --insecure on a trusted LAN" >&2
    exit 2
fi
exec flower-supernode "${args[@]}" "${extra[@]}"
