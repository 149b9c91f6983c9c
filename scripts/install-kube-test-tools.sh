#!/usr/bin/env bash
# What the chart's install test (tests/chart/test_install.py) runs against: a real Kubernetes
# API server and the CRDs of the custom resources the chart renders. Everything lands in
# ~/.cache/toolfleet/kube-test-tools (built or downloaded once, then cached):
#   bin/kube-apiserver  built from the Go modules of k8s.io/kubernetes (about 5 minutes once);
#                       `go install ...@version` refuses that module (its go.mod replaces the
#                       k8s.io staging modules with local directories), so a small module
#                       here requires it and replaces each staging module with its release.
#   crds/*.yaml         KEDA's (ScaledObject, TriggerAuthentication) and the Prometheus
#                       Operator's (ServiceMonitor, PrometheusRule) CRDs, from their Go module
#                       zips (the same files their releases publish).
# etcd comes from Debian's etcd-server package.
set -euo pipefail
KUBERNETES_VERSION=v1.36.3
KEDA_VERSION=v2.21.0
PROMETHEUS_OPERATOR_VERSION=v0.92.1
here="$(cd "$(dirname "$0")" && pwd)"
root="${XDG_CACHE_HOME:-$HOME/.cache}/toolfleet/kube-test-tools"
mkdir -p "$root/bin"

sh "$here/apt-install.sh" etcd etcd-server "install etcd (Debian: apt-get install etcd-server)"

module_field() {  # module_field MODULE@VERSION FIELD: a field of `go mod download -json`
  # GOFLAGS=-mod=mod: outside any module; the download checks the checksum database.
  GOFLAGS=-mod=mod go mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}$/\1/p"
}

stamp="kube-apiserver $KUBERNETES_VERSION"
if [ ! -x "$root/bin/kube-apiserver" ] || [ "$(cat "$root/kube-apiserver.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "building kube-apiserver $KUBERNETES_VERSION from Go modules (first time only, minutes)..." >&2
  src="$root/src"
  rm -rf "$src" && mkdir -p "$src"
  gomod="$(module_field "k8s.io/kubernetes@$KUBERNETES_VERSION" GoMod)"
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  {
    echo "module toolfleet.test/kube-test-tools"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$gomod"
    echo
    sed -n 's/^[[:space:]]*\(k8s.io\/[a-z0-9-]*\) => \.\/staging\/src\/.*/\1/p' "$gomod" \
      | while read -r staged; do echo "replace $staged => $staged $staging_version"; done
  } > "$src/go.mod"
  minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for var in "gitVersion=$KUBERNETES_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
    ldflags="$ldflags -X k8s.io/component-base/version.$var"
  done
  (
    cd "$src"
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION"
    go build -trimpath -ldflags "$ldflags" -o "$root/bin/kube-apiserver.new" \
      k8s.io/kubernetes/cmd/kube-apiserver
  )
  mv "$root/bin/kube-apiserver.new" "$root/bin/kube-apiserver"
  echo "$stamp" > "$root/kube-apiserver.stamp"
fi

crds_stamp="keda $KEDA_VERSION prometheus-operator $PROMETHEUS_OPERATOR_VERSION"
if [ "$(cat "$root/crds.stamp" 2>/dev/null)" != "$crds_stamp" ]; then
  rm -rf "$root/crds" && mkdir -p "$root/crds"
  keda="$(module_field "github.com/kedacore/keda/v2@$KEDA_VERSION" Dir)"
  for name in scaledobjects triggerauthentications clustertriggerauthentications; do
    cp "$keda/config/crd/bases/keda.sh_$name.yaml" "$root/crds/"
  done
  operator="$(module_field "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" Dir)"
  for name in servicemonitors prometheusrules; do
    cp "$operator/example/prometheus-operator-crd/monitoring.coreos.com_$name.yaml" "$root/crds/"
  done
  chmod 644 "$root"/crds/*.yaml
  echo "$crds_stamp" > "$root/crds.stamp"
fi
"$root/bin/kube-apiserver" --version
