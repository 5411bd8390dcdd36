#!/usr/bin/env bash
# up.sh: a REAL Kubernetes node on this machine, on loopback: Debian's
# containerd 1.6 + runc, a kubelet v1.37.1 built from source, joined to an
# etcd + kube-apiserver it starts (or to an API server you name). Only the GPU
# stays simulated (test/simgpu: a simulated driver and libnvidia-ml).
#
# Needs: Debian 12, root, Go >= 1.26, Debian's package mirror and the Go
# module proxy (first run only: apt-get install containerd runc
# containernetworking-plugins busybox-static); openssl, curl. BIN_DIR holds
# kube-apiserver and kubelet (and etcd, else /usr/bin/etcd; kube-scheduler
# and kube-controller-manager if wanted): this checkout's .cache/bin after
# hack/test-bins.sh, which builds them from k8s.io/kubernetes v1.37.1
# (module test/tools).
# Tested on: a Firecracker VM, Debian 12, kernel 6.18, cgroup v1 hybrid
# (cgroup2 at /sys/fs/cgroup/unified), no CAP_SYS_RESOURCE; cgroup v2-only
# hosts are untested. One node per machine: the kubelet's ports (10250,
# 10248 on 127.0.0.1) and device-plugin directory are fixed.
# Config changes reach a running containerd/kubelet only after down.sh.
#
# Usage: up.sh BIN_DIR                start etcd + kube-apiserver + containerd + kubelet
#        up.sh --join KUBECONFIG      containerd + kubelet only, registered with that
#                                     API server using that kubeconfig's credentials
#        down.sh                      stop all of it (pods removed, mounts and cgroups cleaned)
# Idempotent: what is already running is kept. Quiet: on success it prints
# only KEY=value lines (KUBECONFIG, sockets, paths, images); progress and
# timings go to $RN_DIR/up.log.
#
# Env: RN_DIR (/tmp/gpuslice-realnode: everything but the two fixed paths below),
#      SCHEDULER (1: also start kube-scheduler and kube-controller-manager
#      from BIN_DIR when there; 0: not, then set spec.nodeName yourself),
#      SERVICE_ACCOUNTS (1: ServiceAccount admission on when the
#      controller-manager runs, so pods get tokens; 0: off, tokenless pods),
#      NODE_NAME (realnode), API_PORT (16443), ETCD_PORT (12379),
#      KUBELET_BIN (default BIN_DIR/kubelet),
#      RN_CACHE (this checkout's .cache/realnode: helper binaries, kept by down.sh),
#      READY_TIMEOUT (120 s for the Node to be Ready),
#      NODE_STATUS_UPDATE_FREQUENCY (10s, the kubelet's default: a device
#      plugin's new count reaches Node.status.allocatable 0-10 s later).
# Fixed by the kubelet whatever its --root-dir: the device-plugin socket
# /var/lib/kubelet/device-plugins/kubelet.sock; pod logs go to /var/log/pods.
# CDI: when BIN_DIR holds nvidia-container-runtime.cdi, pods with a
# RuntimeClass of handler nvidia-cdi (or nvidia: the same runtime) get the CDI
# devices named in their cdi.k8s.io/ annotations, or else in their
# NVIDIA_VISIBLE_DEVICES, from the specs in CDI_SPEC_DIR (printed then).
# Pods get no network but their own loopback (CNI plugin "noop", pod IP
# reported as 127.0.0.1); hostNetwork pods work too. Images: none pulled;
# preloaded: registry.k8s.io/pause:3.10 (sandbox) and realnode.local/busybox:1.35
# (Debian's busybox-static; use imagePullPolicy: Never). Import more with
#   ctr --address $CONTAINERD_SOCK -n k8s.io images import IMAGE.tar
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
RN="${RN_DIR:-/tmp/gpuslice-realnode}"
CACHE="${RN_CACHE:-$REPO/.cache/realnode}"
NODE="${NODE_NAME:-realnode}"
API_PORT="${API_PORT:-16443}"
ETCD_PORT="${ETCD_PORT:-12379}"
ETCD_PEER_PORT=$((ETCD_PORT + 1))
READY_TIMEOUT="${READY_TIMEOUT:-120}"

JOIN=""
BIN_DIR=""
case "${1:-}" in
  --join) JOIN="${2:?--join needs a kubeconfig}"; [[ -f "$JOIN" ]] || { echo "up.sh: no kubeconfig at $JOIN" >&2; exit 1; }
          JOIN="$(cd "$(dirname "$JOIN")" && pwd)/$(basename "$JOIN")" ;;
  "") echo "usage: up.sh BIN_DIR | up.sh --join KUBECONFIG" >&2; exit 2 ;;
  *) BIN_DIR="$(cd "$1" && pwd)" ;;
esac

mkdir -p "$RN"/{run,logs,certs,cni/bin,cni/net.d,containerd,kubelet,etcd-data,images} "$CACHE/bin"
LOG="$RN/up.log"
: >>"$LOG"
T0=$(date +%s.%N)
say() { echo "[$(date +%T) +$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s] $*" >>"$LOG"; }
die() { say "FAILED: $*"; echo "up.sh: $*" >&2; echo "up.sh: see $LOG and $RN/logs/" >&2; exit 1; }
say "---- up.sh ${JOIN:+--join $JOIN}${BIN_DIR}"
# What a failure on another machine needs first: how much disk the kubelet and
# containerd see.
say "disk under $RN: $(df -h --output=size,avail,pcent "$RN" | tail -1 | tr -s ' ')"

# running NAME: true when the pid in run/NAME.pid is alive and is NAME.
running() {
  local f="$RN/run/$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid=$(cat "$f")
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2"
}
# start NAME MATCH CMD...: start CMD in its own session, log to logs/NAME.log.
start() {
  local name=$1 match=$2; shift 2
  if running "$name" "$match"; then say "$name already running (pid $(cat "$RN/run/$name.pid"))"; return 0; fi
  setsid "$@" >"$RN/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RN/run/$name.pid"
  say "$name started (pid $!)"
}
wait_for() { # wait_for SECONDS WHAT CMD...
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < end )) || die "$what not ready after ${t}s"
    sleep 0.2
  done
  say "$what ready"
}

# ---- 1. Debian packages
pkgs=(containerd runc containernetworking-plugins busybox-static openssl curl)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 ||
    { apt-get update -qq >>"$LOG" 2>&1 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1; } ||
    die "apt-get install ${missing[*]} failed"
fi

# ---- 2. helper binaries (stdlib-only pause/mkimage; rnctl: CRI + PodResources
# client), packages of this module under test/realnode/cmd
export CGO_ENABLED=0
for tool in pause mkimage rnctl; do
  if [[ ! -x "$CACHE/bin/$tool" || -n "$(find "$HERE/../cmd/$tool" -newer "$CACHE/bin/$tool" -name '*.go' 2>/dev/null)" ]]; then
    say "building $tool"
    (cd "$REPO" && go build -trimpath -ldflags "-s -w" -o "$CACHE/bin/$tool.tmp" "./test/realnode/cmd/$tool") >>"$LOG" 2>&1 || die "building $tool failed"
    mv "$CACHE/bin/$tool.tmp" "$CACHE/bin/$tool"
  fi
done
unset CGO_ENABLED
RNCTL="$CACHE/bin/rnctl"

# ---- 3. kubelet (built by hack/test-bins.sh with the control plane)
KUBELET="${KUBELET_BIN:-${BIN_DIR:-$REPO/.cache/bin}/kubelet}"
[[ -x "$KUBELET" ]] || die "no kubelet at $KUBELET (run hack/test-bins.sh)"

# ---- 4. containerd (CRI, cgroupfs, overlayfs, noop CNI)
SOCK="$RN/containerd/containerd.sock"
install -m 0755 "$HERE/cni-noop" "$RN/cni/bin/noop"
ln -sf /usr/lib/cni/loopback "$RN/cni/bin/loopback"
cat >"$RN/cni/net.d/10-noop.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "noop", "plugins": [{"type": "noop"}]}
EOF
snap=overlayfs
grep -qw overlay /proc/filesystems || snap=native
restrict_oom=false
# CAP_SYS_RESOURCE is bit 24 of CapBnd
(( (16#$(awk '/^CapBnd/{print $2}' /proc/self/status) >> 24) & 1 )) || restrict_oom=true
# CDI: containerd 1.6.20 has no CDI support of its own (enable_cdi and
# cdi_spec_dirs arrived in 1.7), so CDI requests go the way NVIDIA documents
# for older containerd and k3s ships as its nvidia-cdi RuntimeClass: the
# runtime handler "nvidia-cdi" runs NVIDIA's nvidia-container-runtime in CDI
# mode (hack/nvidia-bins.sh builds it), containerd passes the cdi.k8s.io/
# annotations a device plugin returns through to the OCI spec, and the
# runtime applies the specs in $RN/cdi before handing over to runc. The
# kubelet's CRI CDIDevices field (the cdi-cri strategy) needs containerd >= 1.7.
# The handler "nvidia" (k3s's RuntimeClass for GPU pods) runs the same
# binary: on k3s it is nvidia-container-runtime, whose auto mode (jit-cdi since
# v1.18, legacy before) sets the container up from the real driver
# (NVML, /dev/nvidia*, the driver's libraries), which this node has none of;
# here the edits come from the pre-generated spec in $RN/cdi, as
# `nvidia-ctk cdi generate` writes it, and NVIDIA_VISIBLE_DEVICES=all asks
# for its device nvidia.com/gpu=all.
CDI_RUNTIME="${BIN_DIR:-$REPO/.cache/bin}/nvidia-container-runtime.cdi"
cdi_runtime=""
if [[ -x "$CDI_RUNTIME" ]]; then
  mkdir -p "$RN/cdi" "$RN/nvidia-container-runtime"
  cat >"$RN/nvidia-container-runtime/config.toml" <<EOF
[nvidia-container-runtime]
debug = "$RN/logs/nvidia-container-runtime.log"
log-level = "info"
runtimes = ["$(command -v runc)"]
[nvidia-container-runtime.modes.cdi]
spec-dirs = ["$RN/cdi"]
annotation-prefixes = ["cdi.k8s.io/"]
EOF
  for handler in nvidia-cdi nvidia; do
    cdi_runtime+="    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.$handler]
      runtime_type = \"io.containerd.runc.v2\"
      container_annotations = [\"cdi.k8s.io/*\"]
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.$handler.options]
        BinaryName = \"$CDI_RUNTIME\"
        SystemdCgroup = false
"
  done
fi
cat >"$RN/containerd/config.toml" <<EOF
version = 2
root = "$RN/containerd/root"
state = "$RN/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  tolerate_missing_hugetlb_controller = true
  # Without CAP_SYS_RESOURCE (this VM's bounding set lacks it) runc cannot
  # lower oom_score_adj (pause: -998, Guaranteed pods: -997) and dies with
  # "can't get final child's PID from pipe: EOF": clamp to containerd's own.
  restrict_oom_score_adj = $restrict_oom
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snap"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
$cdi_runtime
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$RN/cni/bin"
    conf_dir = "$RN/cni/net.d"
    max_conf_num = 1
EOF
start containerd "$RN/containerd/config.toml" env "NVIDIA_CTK_CONFIG_FILE_PATH=$RN/nvidia-container-runtime/config.toml" \
  containerd --config "$RN/containerd/config.toml"
wait_for 30 containerd "$RNCTL" cri-status -endpoint "$SOCK"

# ---- 5. images (no registry): pause as the sandbox image, busybox as a workload
CTR=(ctr --address "$SOCK" -n k8s.io)
have_image() { "${CTR[@]}" images ls -q 2>/dev/null | grep -qx "$1"; }
if ! have_image registry.k8s.io/pause:3.10; then
  "$CACHE/bin/mkimage" -o "$RN/images/pause.tar" -tag registry.k8s.io/pause:3.10 -entrypoint /pause "$CACHE/bin/pause=/pause"
  "${CTR[@]}" images import "$RN/images/pause.tar" >>"$LOG" 2>&1 || die "importing pause failed"
fi
if ! have_image realnode.local/busybox:1.35; then
  links=()
  for a in $(/bin/busybox --list); do [[ $a == busybox ]] || links+=(-link "/bin/busybox=/bin/$a"); done
  "$CACHE/bin/mkimage" -o "$RN/images/busybox.tar" -tag realnode.local/busybox:1.35 -cmd /bin/sh "${links[@]}" /bin/busybox=/bin/busybox
  "${CTR[@]}" images import "$RN/images/busybox.tar" >>"$LOG" 2>&1 || die "importing busybox failed"
fi

# ---- 6. certificates and kubeconfigs
C="$RN/certs"
ossl() { openssl "$@" >>"$LOG" 2>&1; }
kubeconfig() { # kubeconfig FILE SERVER CA CERT KEY
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster: {server: "$2", certificate-authority: "$3"}
users:
- name: user
  user: {client-certificate: "$4", client-key: "$5"}
contexts:
- name: realnode
  context: {cluster: realnode, user: user}
current-context: realnode
EOF
}
if [[ -z "$JOIN" ]]; then
  if [[ ! -f "$C/node.crt" ]]; then
    say "generating certificates"
    ossl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=realnode-ca" -keyout "$C/ca.key" -out "$C/ca.crt"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >"$C/server.ext"
    printf 'extendedKeyUsage=clientAuth\n' >"$C/client.ext"
    ossl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$C/apiserver.key" -out "$C/apiserver.csr"
    ossl x509 -req -in "$C/apiserver.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 3650 -extfile "$C/server.ext" -out "$C/apiserver.crt"
    ossl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=admin" -keyout "$C/admin.key" -out "$C/admin.csr"
    ossl x509 -req -in "$C/admin.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 3650 -extfile "$C/client.ext" -out "$C/admin.crt"
    ossl genrsa -out "$C/sa.key" 2048
    ossl rsa -in "$C/sa.key" -pubout -out "$C/sa.pub"
    # the kubelet's own identity, so the Node authorizer and NodeRestriction apply to it
    ossl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$NODE" -keyout "$C/node.key" -out "$C/node.csr"
    ossl x509 -req -in "$C/node.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -days 3650 -extfile "$C/client.ext" -out "$C/node.crt"
  fi
  KCFG="$RN/admin.kubeconfig"
  KUBELET_KCFG="$RN/kubelet.kubeconfig"
  kubeconfig "$KCFG" "https://127.0.0.1:$API_PORT" "$C/ca.crt" "$C/admin.crt" "$C/admin.key"
  kubeconfig "$KUBELET_KCFG" "https://127.0.0.1:$API_PORT" "$C/ca.crt" "$C/node.crt" "$C/node.key"

  # ---- 7. etcd + kube-apiserver
  ETCD="$BIN_DIR/etcd"; [[ -x "$ETCD" ]] || ETCD="$(command -v etcd || true)"
  [[ -n "$ETCD" && -x "$ETCD" ]] || die "no etcd in $BIN_DIR or on PATH (apt-get install etcd-server)"
  [[ -x "$BIN_DIR/kube-apiserver" ]] || die "no kube-apiserver in $BIN_DIR"
  etcd_extra=()
  "$ETCD" --help 2>&1 | grep -q -- '--unsafe-no-fsync' && etcd_extra+=(--unsafe-no-fsync)
  start etcd "$RN/etcd-data" "$ETCD" --name realnode --data-dir "$RN/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "realnode=http://127.0.0.1:$ETCD_PEER_PORT" "${etcd_extra[@]}"
  # ServiceAccount admission (pods get their ServiceAccount's token, as on
  # every real cluster) needs the controller-manager, which creates each
  # namespace's default ServiceAccount and its kube-root-ca.crt: without it
  # (SCHEDULER=0) or with SERVICE_ACCOUNTS=0 it is off and pods run tokenless.
  sa_admission=(--disable-admission-plugins ServiceAccount)
  if [[ "${SCHEDULER:-1}" != 0 && "${SERVICE_ACCOUNTS:-1}" != 0 && -x "$BIN_DIR/kube-controller-manager" ]]; then
    sa_admission=()
  fi
  start kube-apiserver "$C/apiserver.crt" "$BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --cert-dir "$C" --tls-cert-file "$C/apiserver.crt" --tls-private-key-file "$C/apiserver.key" \
    --client-ca-file "$C/ca.crt" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --service-account-issuer "https://127.0.0.1:$API_PORT/" \
    --service-account-key-file "$C/sa.pub" --service-account-signing-key-file "$C/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    "${sa_admission[@]}" \
    --endpoint-reconciler-type none --allow-privileged=true
  api() { curl -sf --cacert "$C/ca.crt" --cert "$C/admin.crt" --key "$C/admin.key" "https://127.0.0.1:$API_PORT$1"; }
  wait_for 90 kube-apiserver api /readyz

  # kube-scheduler + kube-controller-manager when BIN_DIR has them (SCHEDULER=0:
  # not). Without the controller-manager the kubelet's registration taint
  # node.kubernetes.io/not-ready:NoSchedule is never removed, and only pods with
  # spec.nodeName set run.
  if [[ "${SCHEDULER:-1}" != 0 && -x "$BIN_DIR/kube-scheduler" && -x "$BIN_DIR/kube-controller-manager" ]]; then
    auth=(--kubeconfig "$KCFG" --authentication-kubeconfig "$KCFG" --authorization-kubeconfig "$KCFG" --bind-address 127.0.0.1 --leader-elect=false)
    # --secure-port 0: no health port, so nothing collides with other tests'
    # control planes on this machine.
    start kube-scheduler "kube-scheduler --kubeconfig $KCFG" "$BIN_DIR/kube-scheduler" "${auth[@]}" --secure-port 0
    start kube-controller-manager "kube-controller-manager --kubeconfig $KCFG" "$BIN_DIR/kube-controller-manager" "${auth[@]}" --secure-port 0 \
      --service-account-private-key-file "$C/sa.key" --root-ca-file "$C/ca.crt" --use-service-account-credentials=false
    if ((${#sa_admission[@]} == 0)); then
      # Until it exists the admission plugin refuses every pod of the namespace.
      wait_for 60 "ServiceAccount default/default" api /api/v1/namespaces/default/serviceaccounts/default
    fi
  fi
else
  KCFG="$JOIN"
  KUBELET_KCFG="$JOIN"
  api() { false; }
fi

# ---- 8. kubelet (serves only on 127.0.0.1; clients need a cert from our CA)
mkdir -p "$RN/kubelet" "$RN/volume-plugins"
client_ca=""
[[ -z "$JOIN" ]] && client_ca="$C/ca.crt"
cat >"$RN/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$client_ca"}
authorization: {mode: AlwaysAllow}
rotateCertificates: false
serverTLSBootstrap: false
volumePluginDir: $RN/volume-plugins
podLogsDir: /var/log/pods
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# No disk-based eviction: a test machine whose disk is fuller than the
# kubelet's defaults (nodefs 10 %, imagefs 15 % free) would otherwise taint the
# node with DiskPressure, refuse every pod and garbage-collect the images we
# imported (they cannot be pulled back: there is no registry). "0%" switches a
# signal off (seen on this kubelet: no DiskPressure on a 92 % full disk); every
# signal is named so that none is left to a default. EVICTION_HARD replaces
# the block (a test of pressure handling, say).
evictionHard:
${EVICTION_HARD:-  memory.available: "100Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"}
nodeStatusUpdateFrequency: ${NODE_STATUS_UPDATE_FREQUENCY:-10s}
EOF
start kubelet "--root-dir $RN/kubelet" "$KUBELET" --config "$RN/kubelet-config.yaml" --kubeconfig "$KUBELET_KCFG" \
  --root-dir "$RN/kubelet" --cert-dir "$RN/kubelet/pki" --hostname-override "$NODE" --v 2
wait_for 60 "kubelet healthz" curl -sf http://127.0.0.1:10248/healthz
if [[ -z "$JOIN" ]]; then
  node_ready() { api "/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; }
  wait_for "$READY_TIMEOUT" "Node $NODE Ready" node_ready
  if running kube-controller-manager "kube-controller-manager --kubeconfig $KCFG"; then
    untainted() { ! api "/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q 'node.kubernetes.io/not-ready'; }
    wait_for 60 "Node $NODE untainted" untainted
  fi
else
  node_ready() { grep -q 'Successfully registered node\|Node became not ready\|"Fast updating node status"' "$RN/logs/kubelet.log"; }
  wait_for "$READY_TIMEOUT" "Node $NODE registered" node_ready
fi
say "up"

cat <<EOF
KUBECONFIG=$KCFG
NODE_NAME=$NODE
CONTAINERD_SOCK=$SOCK
POD_RESOURCES_SOCK=$RN/kubelet/pod-resources/kubelet.sock
DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins
POD_LOGS_DIR=/var/log/pods
KUBELET_ROOT_DIR=$RN/kubelet
WORKLOAD_IMAGE=realnode.local/busybox:1.35
RNCTL=$RNCTL
LOGS=$RN/logs
DOWN=$HERE/down.sh
EOF
if [[ -n "$cdi_runtime" ]]; then
  echo "CDI_SPEC_DIR=$RN/cdi"
  echo "CDI_RUNTIME_HANDLER=nvidia-cdi"
  echo "NVIDIA_RUNTIME_HANDLER=nvidia"
fi
