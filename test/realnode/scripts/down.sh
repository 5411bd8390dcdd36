#!/usr/bin/env bash
# down.sh: stop what up.sh started (kubelet, containerd, kube-apiserver, etcd),
# each by the pid up.sh recorded; remove every pod sandbox through the CRI
# first (containers, netns and shm mounts go with them), then unmount what is
# left under RN_DIR, remove the pods' log directories, the kubelet's empty
# cgroups and its files in /var/lib/kubelet/device-plugins.
#
# Usage: down.sh [--purge]    --purge also deletes RN_DIR (certs, etcd data,
#                             containerd's images); built binaries stay in RN_CACHE.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
RN="${RN_DIR:-/tmp/gpuslice-realnode}"
CACHE="${RN_CACHE:-$REPO/.cache/realnode}"
[[ -d "$RN/run" ]] || exit 0
LOG="$RN/up.log"
say() { echo "[$(date +%T)] down: $*" >>"$LOG"; }

# stop NAME MATCH...: SIGTERM the recorded pids (if still NAME, matching MATCH)
# together, SIGKILL what is left after 15 s.
stop() {
  local pids=() name match f pid
  while (($#)); do
    name=$1 match=$2; shift 2
    f="$RN/run/$name.pid"
    [[ -f "$f" ]] || continue
    pid=$(cat "$f"); rm -f "$f"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$match"; then
      kill "$pid" 2>/dev/null && pids+=("$pid") && say "$name: SIGTERM pid $pid"
    fi
  done
  for _ in $(seq 1 150); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null && say "SIGKILL pid $pid"; done
  true
}

SOCK="$RN/containerd/containerd.sock"
stop kubelet "--root-dir $RN/kubelet"
# Pod sandboxes: stopping them kills their containers and shims and removes
# their netns and shm mounts; their pods' log directories go too.
if [[ -S "$SOCK" && -x "$CACHE/bin/rnctl" ]]; then
  while read -r uid; do
    [[ -n "$uid" ]] && rm -rf /var/log/pods/*_"$uid"
  done < <("$CACHE/bin/rnctl" cri-clean -endpoint "$SOCK" 2>>"$LOG")
fi
find /var/log/containers -maxdepth 1 -xtype l -delete 2>/dev/null
stop containerd "$RN/containerd/config.toml" \
  kube-controller-manager "kube-controller-manager --kubeconfig $RN/admin.kubeconfig" \
  kube-scheduler "kube-scheduler --kubeconfig $RN/admin.kubeconfig" \
  kube-apiserver "$RN/certs/apiserver.crt"
stop etcd "$RN/etcd-data"

# Mounts left under RN_DIR (kubelet volumes, overlay rootfs of a task that
# outlived its sandbox), deepest first.
awk -v p="$RN/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  say "unmounted $m"
done
# The kubelet's cgroups (cgroupfs driver, cgroupRoot /): empty ones only, deepest first.
for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [[ -d "$h/kubepods" ]] && find "$h/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
done
# The kubelet's fixed device-plugin directory, and the link to its
# PodResources socket's directory that the plain-manifest test makes (the
# manifests mount /var/lib/kubelet/pod-resources).
rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
[[ -L /var/lib/kubelet/pod-resources ]] && rm -f /var/lib/kubelet/pod-resources
rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
# Empty directories containerd's shims and CRI leave in /run (unless a system
# containerd is using them).
if [[ ! -S /run/containerd/containerd.sock ]]; then
  rmdir /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd/fifo /run/containerd/s /run/containerd 2>/dev/null
fi
rmdir /var/run/netns /var/log/pods /var/log/containers 2>/dev/null
if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$RN"
fi
true
