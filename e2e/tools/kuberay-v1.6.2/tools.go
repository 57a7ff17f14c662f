//go:build tools

// Package tools pins the program e2e/setup builds from this module.
package tools

import _ "github.com/ray-project/kuberay/ray-operator"
