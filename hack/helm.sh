#!/usr/bin/env bash
# Builds (once) the helm command the deploy tests and `make manifests` run:
# helm.sh/helm/v3 v3.19.2 from the Go module proxy, through the separate module
# test/helmtool so Helm's dependencies stay out of the main go.mod. The binary
# lands in $GPUSLICE_HELM_DIR (default .cache/bin, git-ignored) and is kept:
# a cold build takes several minutes on 2 cores. Prints the binary's path.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${GPUSLICE_HELM_DIR:-$root/.cache/bin}
helm="$out/helm"
# One build at a time: `make test` runs this in the background while tests
# that need the result call it too; they wait here for the build in progress.
mkdir -p "$out"
exec 9>"$out/.helm.lock"
flock 9
if [ ! -x "$helm" ]; then
  mkdir -p "$out"
  # The same version stamps Helm's own Makefile sets: without them
  # `helm version` says v3.x-dev and .Capabilities.KubeVersion says v1.20.
  version=v3.19.2
  k8s_minor=$(cd "$root/test/helmtool" && go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  echo "building helm $version into $out (slow the first time)" >&2
  # The temporary name keeps a half-written binary from passing the -x test
  # above if the build is interrupted.
  (cd "$root/test/helmtool" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$helm.tmp" helm.sh/helm/v3/cmd/helm)
  mv "$helm.tmp" "$helm"
fi
echo "$helm"
