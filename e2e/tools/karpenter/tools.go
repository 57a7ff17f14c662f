//go:build tools

// Package tools pins the program e2e/control-plane builds from this module: Karpenter with its
// kwok cloud provider (sigs.k8s.io/karpenter/kwok), the real node autoscaler of the autoscaler
// suite. It creates Nodes annotated kwok.x-k8s.io/node=fake, which the harness's kwok runs.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
