#!/usr/bin/env bash
# Create a private certificate authority and a SuperLink server certificate signed by it.
#
# usage: make-certs.sh OUT_DIR [SAN ...]
#   SAN: extra names the devices use to reach the server, e.g. IP:192.168.1.10 DNS:fl-server.lan
#        (DNS:localhost and IP:127.0.0.1 are always included).
#
# Writes OUT_DIR/ca.crt (copy it to every device), OUT_DIR/ca.key (keep offline), and the
# server's OUT_DIR/server.pem + OUT_DIR/server.key (stay on the server). Refuses to overwrite an
# existing CA, because that would lock out every device that trusts the old one.
# Environment: FEDAPP_CERT_DAYS (validity, default 365), FEDAPP_RSA_BITS (default 3072).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [SAN ...]   e.g. $0 certs IP:192.168.1.10" >&2
    exit 2
fi
out=$1
shift
days=${FEDAPP_CERT_DAYS:-365}
bits=${FEDAPP_RSA_BITS:-3072}
sans="DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
    sans+=",${san}"
done

if [[ -e "${out}/ca.key" ]]; then
    echo "error: ${out}/ca.key exists; remove ${out} first if you really want a new CA" >&2
    exit 1
fi
mkdir -p "${out}"
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

(
    umask 077 # private keys readable by their owner only
    openssl req -x509 -newkey "rsa:${bits}" -nodes -sha256 -days "${days}" \
        -keyout "${out}/ca.key" -out "${out}/ca.crt" -subj "/CN=fedapp-ca" 2>/dev/null
    openssl req -newkey "rsa:${bits}" -nodes -sha256 \
        -keyout "${out}/server.key" -out "${work}/server.csr" -subj "/CN=fedapp-superlink" 2>/dev/null
)
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "${sans}" \
    >"${work}/server.ext"
openssl x509 -req -sha256 -days "${days}" -in "${work}/server.csr" \
    -CA "${out}/ca.crt" -CAkey "${out}/ca.key" -CAcreateserial -CAserial "${work}/ca.srl" \
    -extfile "${work}/server.ext" -out "${out}/server.pem" 2>/dev/null
chmod 644 "${out}/ca.crt" "${out}/server.pem"

echo "CA certificate:     ${out}/ca.crt   (copy to every device and to the machine that runs flwr)"
echo "CA key:             ${out}/ca.key   (keep offline; needed only to issue new server certs)"
echo "server certificate: ${out}/server.pem for ${sans}"
echo "server key:         ${out}/server.key"
