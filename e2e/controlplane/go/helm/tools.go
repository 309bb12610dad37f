//go:build tools

// Package tools only records, for `go mod tidy`, which main package this
// module builds. It is never compiled.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
