#!/usr/bin/env bash
# Builds (once) the real Kubernetes binaries the integration and e2e tests
# run: kube-apiserver, kube-scheduler, kube-controller-manager and the kubelet
# of the real test node from k8s.io/kubernetes (module test/tools), and etcd (Debian's etcd-server if
# installed, otherwise built from the Go module proxy). They land in
# $GPUSLICE_ASSETS (default .cache/bin), the KUBEBUILDER_ASSETS directory envtest
# reads. Binaries already there are kept: a cold build takes about 10 minutes
# on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPUSLICE_ASSETS:-$root/.cache/bin}
mkdir -p "$out"
version=v1.37.1
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
for cmd in kube-apiserver kube-scheduler kube-controller-manager kubelet; do
  if [ ! -x "$out/$cmd" ]; then
    echo "building $cmd $version into $out (slow the first time)" >&2
    (cd "$root/test/tools" && go build -trimpath -ldflags "$ldflags" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$out/$cmd.tmp" "$out/$cmd"
  fi
done
if [ ! -x "$out/etcd" ]; then
  if [ -x /usr/bin/etcd ]; then
    ln -sf /usr/bin/etcd "$out/etcd"
  else
    echo "building etcd v3.6.14 into $out" >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && go mod init etcdbuild >/dev/null 2>&1 && go get go.etcd.io/etcd/server/v3@v3.6.14 >/dev/null 2>&1 &&
      go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
    rm -rf "$tmp"
  fi
fi
echo "$out"
