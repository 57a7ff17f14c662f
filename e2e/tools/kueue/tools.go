//go:build tools

// Package tools pins the program e2e/control-plane builds from this module: the Kueue manager
// (sigs.k8s.io/kueue/cmd/kueue), the real quota engine of 'up --kueue' and the kueue suite. Its
// CRDs and webhook paths are read from the same module's zip in the module cache.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
