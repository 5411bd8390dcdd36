#!/usr/bin/env bash
# Installs the Debian packages the test suite runs for real, when missing:
# etcd (the API server's store), Prometheus + promtool and Alertmanager +
# amtool (rules, alerts), containerd + runc + the CNI plugins and a static
# busybox (the real test node of test/realnode), and node_exporter (the
# side-by-side cost benchmark). Needs root (or sudo) on Debian; prints
# nothing when all is there.
set -euo pipefail
want=(etcd-server prometheus prometheus-alertmanager containerd runc containernetworking-plugins busybox-static prometheus-node-exporter openssl curl)
need=()
for p in "${want[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
[ ${#need[@]} -eq 0 ] && exit 0
echo "installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
  { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
# Debian starts the services it installs where systemd runs; the tests start
# their own, on other ports, so these are left alone.
