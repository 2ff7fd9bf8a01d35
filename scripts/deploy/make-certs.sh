#!/usr/bin/env bash
# Create a private certificate authority and a SuperLink server certificate signed by it.
#
# usage: make-certs.sh [--ca-dir CA_DIR] OUT_DIR [SAN ...]
#   SAN: extra names the devices use to reach the server, e.g. IP:192.168.1.10 DNS:fl-server.lan
#        (DNS:localhost and IP:127.0.0.1 are always included).
#   --ca-dir: where the CA's private key is made (default OUT_DIR-ca, beside OUT_DIR, never in it)
#
# OUT_DIR gets what the SuperLink needs and nothing more: ca.crt (copy it to every device too),
# server.pem and server.key. The CA's key (CA_DIR/ca.key, with a copy of ca.crt) is what signs
# server certificates: whoever holds it can impersonate the server to every device, so move
# CA_DIR off the server (a USB stick, an offline machine) once this ends. Brought back, an
# existing CA_DIR signs a new server certificate (a new name, an expired one) and is never
# overwritten, since a new CA would lock out every device that trusts the old one.
# Environment: FEDAPP_CERT_DAYS (validity, default 365), FEDAPP_RSA_BITS (default 3072).
set -euo pipefail

usage() {
    echo "usage: $0 [--ca-dir CA_DIR] OUT_DIR [SAN ...]   e.g. $0 certs IP:192.168.1.10" >&2
    exit 2
}
ca_dir=""
if [[ "${1:-}" == --ca-dir ]]; then
    [[ $# -ge 2 && -n "$2" ]] || usage
    ca_dir=$2
    shift 2
fi
[[ $# -ge 1 && -n "$1" && "$1" != -* ]] || usage
out=${1%/}
shift
ca_dir=${ca_dir:-${out}-ca}
days=${FEDAPP_CERT_DAYS:-365}
bits=${FEDAPP_RSA_BITS:-3072}
sans="DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
    sans+=",${san}"
done

mkdir -p "${out}"
[[ -d "${ca_dir}" ]] || (umask 077 && mkdir -p "${ca_dir}")
if [[ "$(cd "${ca_dir}" && pwd)" == "$(cd "${out}" && pwd)" ]]; then
    echo "error: --ca-dir must not be OUT_DIR: the CA's key does not belong beside the server's" >&2
    exit 2
fi
if [[ -e "${out}/ca.key" ]]; then
    echo "error: ${out}/ca.key exists: move it into a CA folder of its own (--ca-dir) and keep that offline" >&2
    exit 1
fi
if [[ -e "${out}/server.key" ]]; then
    echo "error: ${out}/server.key exists; remove it first if you really want a new server key" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

(
    umask 077 # private keys readable by their owner only
    if [[ -e "${ca_dir}/ca.key" ]]; then
        [[ -f "${ca_dir}/ca.crt" ]] || { echo "error: ${ca_dir}/ca.key without ca.crt" >&2; exit 1; }
        echo "using the existing CA in ${ca_dir}" >&2
    else
        openssl req -x509 -newkey "rsa:${bits}" -nodes -sha256 -days "${days}" \
            -keyout "${ca_dir}/ca.key" -out "${ca_dir}/ca.crt" -subj "/CN=fedapp-ca" 2>/dev/null
    fi
    openssl req -newkey "rsa:${bits}" -nodes -sha256 \
        -keyout "${out}/server.key" -out "${work}/server.csr" -subj "/CN=fedapp-superlink" 2>/dev/null
)
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "${sans}" \
    >"${work}/server.ext"
openssl x509 -req -sha256 -days "${days}" -in "${work}/server.csr" \
    -CA "${ca_dir}/ca.crt" -CAkey "${ca_dir}/ca.key" -CAcreateserial -CAserial "${work}/ca.srl" \
    -extfile "${work}/server.ext" -out "${out}/server.pem" 2>/dev/null
cp "${ca_dir}/ca.crt" "${out}/ca.crt"
chmod 644 "${ca_dir}/ca.crt" "${out}/ca.crt" "${out}/server.pem"

echo "CA certificate:     ${out}/ca.crt   (copy to every device and to the machine that runs flwr)"
echo "server certificate: ${out}/server.pem for ${sans}"
echo "server key:         ${out}/server.key"
echo "CA key:             ${ca_dir}/ca.key   (signs server certificates: move ${ca_dir} offline now;"
echo "                    bring it back only to issue a new server certificate)"
