#!/usr/bin/env bash
# Add a SuperLink connection to the Flower configuration of the machine that runs `flwr run`.
#
# usage: add-connection.sh NAME HOST:PORT [CA_CERT | --insecure]
#
# Flower 1.42 keeps connections in $FLWR_HOME/config.toml (default ~/.flwr/config.toml), not in
# pyproject.toml. With CA_CERT the connection uses TLS and trusts that CA; --insecure is for a
# trusted LAN only. A new config file gets NAME as its default connection.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 NAME HOST:PORT CA_CERT|--insecure" >&2
    exit 2
fi
name=$1
address=$2
security=$3
home=${FLWR_HOME:-${HOME}/.flwr}
config="${home}/config.toml"

if [[ "${security}" == "--insecure" ]]; then
    line='insecure = true'
elif [[ -f "${security}" ]]; then
    line="root-certificates = \"$(cd "$(dirname "${security}")" && pwd)/$(basename "${security}")\""
else
    echo "error: no CA certificate at ${security}" >&2
    exit 1
fi

mkdir -p "${home}"
if [[ -f "${config}" ]] && grep -q "^\[superlink\.${name}\]" "${config}"; then
    echo "error: ${config} already has a connection named ${name}" >&2
    exit 1
fi
if [[ ! -f "${config}" ]]; then
    printf '[superlink]\ndefault = "%s"\n' "${name}" >"${config}"
fi
printf '\n[superlink.%s]\naddress = "%s"\n%s\n' "${name}" "${address}" "${line}" >>"${config}"
echo "connection ${name} -> ${address} written to ${config}"
