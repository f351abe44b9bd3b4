#!/usr/bin/env bash
# Install the Debian packages the tests use, only those missing. Needs root.
#   python3-venv       the project's virtualenv on a stock Debian python3
#   debootstrap, systemd-container, iproute2, openssh-client, netcat-openbsd   the lab
#   iptables           the lab's switch and the exporter tests (iptables-save/-restore)
#   containernetworking-plugins   Debian's ptp, host-local and portmap, for the pod accounting's tests
#                      (the CNI chain run in network namespaces off the lab)
#   kubernetes-client  kubectl, which parses the kubeconfigs the roles write (unless one is installed)
#   openssl            verifies the certificates the roles issue
#   gcc, libc6-dev, pkg-config, libseccomp-dev   the lab's build of runc (cgo: its nsenter and seccomp)
#   curl               requests to the lab's API server that kubectl cannot make (impersonated node
#                      identities, the flow-control response headers)
#   promtool, prometheus   from Debian's prometheus package, unpacked into .tools/bin without installing
#                      the package (which would start a Prometheus server on this machine); tests
#                      run them on loopback only
#   golang-go          only where no go is installed: any Go fetches the one Go the components are built
#                      with (superkube.harness.build.GO_VERSION) as a module; Debian 12's own is too old
#                      to build them
#   haproxy            the lab's API load balancer (Azure's internal load balancer, health probe included),
#                      unpacked into .tools/bin likewise (the package would start a service); its
#                      libraries (liblua5.3-0, libopentracing-c-wrapper0) are installed as packages
set -euo pipefail
packages=(python3-venv debootstrap systemd-container iproute2 iptables containernetworking-plugins
  openssh-client netcat-openbsd openssl
  curl liblua5.3-0 libopentracing-c-wrapper0 gcc libc6-dev pkg-config libseccomp-dev)
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)
command -v go >/dev/null 2>&1 || packages+=(golang-go)
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

tools="$(cd "$(dirname "$0")/.." && pwd)/.tools"
# unpack PACKAGE FILE...: the package's files (paths inside it) into .tools/bin, without installing it
unpack() {
  local package="$1" work
  shift
  work="$(mktemp -d)"
  ( cd "$work" && { apt-get download "$package" >/dev/null 2>&1 || { apt-get update -qq && apt-get download "$package" >/dev/null; }; } )
  dpkg-deb -x "$work"/"$package"_*.deb "$work/x"
  mkdir -p "$tools/bin"
  for file in "$@"; do install -m 0755 "$work/x/$file" "$tools/bin/"; done
  rm -rf "$work"
}
if [ ! -x "$tools/bin/promtool" ] || [ ! -x "$tools/bin/prometheus" ]; then
  unpack prometheus usr/bin/promtool usr/bin/prometheus
fi
[ -x "$tools/bin/haproxy" ] || unpack haproxy usr/sbin/haproxy
