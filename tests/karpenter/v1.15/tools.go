//go:build tools

// Package tools pins the Karpenter controller that
// `tests/setup/build-karpenter 1.15` builds (one module per minor under
// tests/karpenter/): importing its main package puts the provider (and, through it,
// sigs.k8s.io/karpenter) in this module's go.mod and go.sum, so the build
// is reproducible from the Go module proxy.
package tools

import (
	_ "github.com/aws/karpenter-provider-aws/cmd/controller"
)
