#!/usr/bin/env bash
# Start the Flower SuperLink (the server) for fedapp; runs in the foreground (Ctrl-C stops it).
#
# usage: start-superlink.sh [--host ADDR] [--port PORT] [--database FILE]
#                           (--certs DIR [--node-auth] | --insecure) [--check] [-- EXTRA_FLOWER_ARGS...]
#   --host      address to listen on (default 127.0.0.1: this machine only). Flower 1.42 serves
#               the devices' Fleet API, the operators' Control API (flwr run/ls/stop, supernode
#               register) and the Runtime API on this one address and port, and the open-source
#               build has no Control-API authentication: whoever reaches it can submit an app,
#               which runs on this server and on every SuperNode. Give the address of an
#               interface only the devices reach (a VPN's, or a LAN's behind a firewall rule
#               admitting only the boards), or keep 127.0.0.1 and tunnel (docs/deployment.md).
#   --port      the one port of those APIs (default 9092)
#   --database  keep runs, nodes and registrations in this SQLite file across restarts
#               (default: in memory, so registered node keys are lost on restart)
#   --certs     directory from make-certs.sh (ca.crt, server.pem, server.key): TLS
#   --node-auth only SuperNodes registered with `flwr supernode register` may join (needs --certs)
#   --insecure  no TLS: for a trusted LAN only
#   --check     check the arguments, print the flower-superlink command and exit
# The app's dependencies must already be installed in this Python environment: the SuperLink is
# told not to `uv sync` them for every run (that would download torch each time).
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

host=127.0.0.1
port=9092
certs=""
insecure=0
node_auth=0
database=""
check=0
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --host | --port | --database | --certs)
            [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
            case $1 in
                --host) host=$2 ;;
                --port) port=$2 ;;
                --database) database=$2 ;;
                --certs) certs=$2 ;;
            esac
            shift 2
            ;;
        --node-auth) node_auth=1; shift ;;
        --insecure) insecure=1; shift ;;
        --check) check=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown option $1 (see the header of $0)" ;;
    esac
done
[[ "${port}" =~ ^[0-9]+$ ]] && ((10#${port} >= 1 && 10#${port} <= 65535)) \
    || die "--port ${port}: expected a port number 1..65535"

args=(--host "${host}" --port "${port}" --disable-runtime-dependency-installation)
if [[ -n "${certs}" ]]; then
    [[ ${insecure} -eq 0 ]] || die "--certs and --insecure exclude each other"
    for file in ca.crt server.pem server.key; do
        [[ -f "${certs}/${file}" ]] || { echo "error: ${certs}/${file} missing (run make-certs.sh)" >&2; exit 1; }
    done
    args+=(--ssl-ca-certfile "${certs}/ca.crt" --ssl-certfile "${certs}/server.pem"
        --ssl-keyfile "${certs}/server.key")
    if [[ ${node_auth} -eq 1 ]]; then
        args+=(--enable-supernode-auth)
    fi
elif [[ ${insecure} -eq 1 ]]; then
    [[ ${node_auth} -eq 0 ]] || die "--node-auth needs TLS (--certs DIR)"
    args+=(--insecure)
else
    die "give --certs DIR for TLS, or --insecure on a trusted LAN"
fi
if [[ -n "${database}" ]]; then
    args+=(--database "${database}")
fi
if [[ "${host}" != 127.0.0.1 && "${host}" != localhost && "${host}" != ::1 ]]; then
    echo "start-superlink: listening on ${host}:${port}: the Control API (submit and stop runs," \
        "register node keys) is reachable from wherever that address is, without authentication" \
        "in open-source Flower; see docs/deployment.md, 'Who can reach the SuperLink'" >&2
fi
if [[ ${check} -eq 1 ]]; then
    echo flower-superlink "${args[@]}" "${extra[@]}"
    exit 0
fi
exec flower-superlink "${args[@]}" "${extra[@]}"
