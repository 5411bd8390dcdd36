#!/usr/bin/env bash
# Checks gpuslice's alerting: the rules parse (promtool check rules), every
# alert fires and stays quiet when it should (promtool test rules), the example
# Alertmanager config is valid (amtool check-config) and routes GPUSliceOOM to
# the gpu-oom receiver and every other alert to the default one (amtool config
# routes test). Exits non-zero if any check fails; runs them all first.
#
# Usage: alerts/check.sh [DIR]   DIR holds the files (default: this script's
# folder). PROMTOOL and AMTOOL override the tools' paths.
set -uo pipefail

dir=${1:-$(cd "$(dirname "$0")" && pwd)}
promtool=${PROMTOOL:-promtool}
amtool=${AMTOOL:-amtool}
rules=$dir/gpuslice-rules.yaml
am=$dir/alertmanager-example.yaml
oom_alert=GPUSliceOOM
oom_receiver=gpu-oom
default_receiver=default

for tool in "$promtool" "$amtool"; do
  if ! command -v "$tool" >/dev/null; then
    echo "check.sh: $tool not found; apt-get install prometheus prometheus-alertmanager" >&2
    exit 2
  fi
done

failed=0
step() {
  echo "== $*"
  if ! "$@"; then
    echo "FAILED: $*" >&2
    failed=$((failed + 1))
  fi
}

shopt -s nullglob
tests=("$dir"/tests/*.yaml)
if [ ${#tests[@]} -eq 0 ]; then
  echo "FAILED: no rule tests under $dir/tests" >&2
  failed=$((failed + 1))
fi

step "$promtool" check rules "$rules"
step "$promtool" test rules "${tests[@]}"
step "$amtool" check-config "$am"

# Every alert in the rules file, so a new alert is routed-tested without
# editing this script.
mapfile -t alerts < <(sed -n 's/^[[:space:]]*-[[:space:]]*alert:[[:space:]]*\([A-Za-z0-9_]*\).*/\1/p' "$rules")
if [ ${#alerts[@]} -eq 0 ]; then
  echo "FAILED: no alerts found in $rules" >&2
  failed=$((failed + 1))
fi
found_oom=0
for a in "${alerts[@]}"; do
  want=$default_receiver
  if [ "$a" = "$oom_alert" ]; then
    want=$oom_receiver
    found_oom=1
  fi
  step "$amtool" config routes test --config.file="$am" --verify.receivers="$want" \
    alertname="$a" severity=critical node=n1 namespace=ml pod=p container=c
done
if [ $found_oom -eq 0 ]; then
  echo "FAILED: $rules has no $oom_alert alert" >&2
  failed=$((failed + 1))
fi

if [ $failed -ne 0 ]; then
  echo "check.sh: $failed check(s) failed" >&2
  exit 1
fi
echo "check.sh: all checks passed"
