#!/usr/bin/env bash
# Start the Flower SuperLink (the server) for fedapp; runs in the foreground (Ctrl-C stops it).
#
# usage: start-superlink.sh [--host ADDR] [--port PORT] [--database FILE]
#                           (--certs DIR [--node-auth] | --insecure) [-- EXTRA_FLOWER_ARGS...]
#   --host      address to listen on (default 0.0.0.0: every interface)
#   --port      one port for the Fleet, Control and Runtime APIs (default 9092)
#   --database  keep runs, nodes and registrations in this SQLite file across restarts
#               (default: in memory, so registered node keys are lost on restart)
#   --certs     directory from make-certs.sh (ca.crt, server.pem, server.key): TLS
#   --node-auth only SuperNodes registered with `flwr supernode register` may join (needs --certs)
#   --insecure  no TLS: for a trusted LAN only
# The app's dependencies must already be installed in this Python environment: the SuperLink is
# told not to `uv sync` them for every run (that would download torch each time).
set -euo pipefail

host=0.0.0.0
port=9092
certs=""
insecure=0
node_auth=0
database=""
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --host) host=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        --database) database=$2; shift 2 ;;
        --certs) certs=$2; shift 2 ;;
        --node-auth) node_auth=1; shift ;;
        --insecure) insecure=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) echo "error: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done

args=(--host "${host}" --port "${port}" --disable-runtime-dependency-installation)
if [[ -n "${certs}" ]]; then
    for file in ca.crt server.pem server.key; do
        [[ -f "${certs}/${file}" ]] || { echo "error: ${certs}/${file} missing (run make-certs.sh)" >&2; exit 1; }
    done
    args+=(--ssl-ca-certfile "${certs}/ca.crt" --ssl-certfile "${certs}/server.pem"
        --ssl-keyfile "${certs}/server.key")
    if [[ ${node_auth} -eq 1 ]]; then
        args+=(--enable-supernode-auth)
    fi
elif [[ ${insecure} -eq 1 ]]; then
    [[ ${node_auth} -eq 0 ]] || { echo "error: --node-auth needs TLS (--certs DIR)" >&2; exit 2; }
    args+=(--insecure)
else
    echo "error: give --certs DIR for TLS, or --insecure on a trusted LAN" >&2
    exit 2
fi
if [[ -n "${database}" ]]; then
    args+=(--database "${database}")
fi
exec flower-superlink "${args[@]}" "${extra[@]}"
