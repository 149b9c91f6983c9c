#!/usr/bin/env bash
# helm and kubeconform for the chart checks of `make test`, built with `go install` from the Go
# module proxy into $(go env GOPATH)/bin (a few minutes the first time, then cached).
set -euo pipefail
bin="$(go env GOPATH)/bin"
if [ ! -x "$bin/helm" ]; then
  echo "installing helm (go install, first time only)..." >&2
  go install helm.sh/helm/v3/cmd/helm@v3.22.0
fi
if [ ! -x "$bin/kubeconform" ]; then
  go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0
fi
"$bin/helm" version --short >/dev/null
"$bin/kubeconform" -v >/dev/null
