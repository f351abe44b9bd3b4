#!/usr/bin/env bash
# Install the Debian packages the tests use, only those missing. Needs root.
#   python3-venv       the project's virtualenv on a stock Debian python3
#   debootstrap, systemd-container, iproute2, openssh-client, netcat-openbsd   the lab
#   iptables           the lab's switch and the exporter tests (iptables-save/-restore)
#   kubernetes-client  kubectl, which parses the kubeconfigs the roles write (unless one is installed)
#   openssl            verifies the certificates the roles issue
set -euo pipefail
packages=(python3-venv debootstrap systemd-container iproute2 iptables openssh-client netcat-openbsd openssl)
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing Debian packages ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
