#!/usr/bin/env bash
# helm and kubeconform for the chart checks of `make test`, built with `go install` from the Go
# module proxy into $(go env GOPATH)/bin (a few minutes the first time, then cached).
#
# helm's release builds set the Kubernetes version it assumes without a cluster (`helm
# template`, `helm lint`) to that of the client-go they are built with; a plain `go install`
# leaves it at 1.20, below the chart's kubeVersion, so `helm template` would refuse the chart.
# This build sets it the way helm's own Makefile does (-X ...k8sVersionMajor/Minor).
set -euo pipefail
HELM_VERSION=v3.21.4
KUBECONFORM_VERSION=v0.7.0
bin="$(go env GOPATH)/bin"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/toolfleet/chart-tools"
mkdir -p "$cache"

helm_gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
  | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
kube_minor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$helm_gomod")"
if [ -z "$kube_minor" ]; then
  echo "cannot read the client-go version of helm $HELM_VERSION from $helm_gomod" >&2
  exit 1
fi
helm_stamp="helm $HELM_VERSION kubernetes 1.$kube_minor"
if [ ! -x "$bin/helm" ] || [ "$(cat "$cache/helm.stamp" 2>/dev/null)" != "$helm_stamp" ] \
  || [ "$("$bin/helm" version --template '{{.Version}}')" != "$HELM_VERSION" ]; then
  echo "installing $helm_stamp (go install, first time only)..." >&2
  # Its version too, as its Makefile sets it (go install alone reports only v3.MINOR).
  ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
  done
  go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  echo "$helm_stamp" > "$cache/helm.stamp"
fi
if [ ! -x "$bin/kubeconform" ]; then
  go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
fi
"$bin/helm" version --short >/dev/null
"$bin/kubeconform" -v >/dev/null
