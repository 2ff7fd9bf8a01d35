#!/usr/bin/env bash
# Create a SuperNode identity key pair (ECDSA P-384, OpenSSH format) for node authentication.
#
# usage: make-node-key.sh OUT_DIR NAME
#
# Writes OUT_DIR/NAME (private: stays on the device, passed to start-supernode.sh --key) and
# OUT_DIR/NAME.pub (public: registered on the SuperLink with `flwr supernode register`).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 OUT_DIR NAME   e.g. $0 keys pi-kitchen" >&2
    exit 2
fi
out=$1
name=$2
if [[ -e "${out}/${name}" ]]; then
    echo "error: ${out}/${name} exists; a node keeps its key (delete it to make a new identity)" >&2
    exit 1
fi
mkdir -p "${out}"
ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedapp-${name}" -f "${out}/${name}"
echo "private key: ${out}/${name}   (keep on the device)"
echo "public key:  ${out}/${name}.pub"
echo "register it: flwr supernode register ${out}/${name}.pub <connection>"
