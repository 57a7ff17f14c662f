//go:build tools

// Package tools pins the program e2e/setup-tools builds from this module.
package tools

import _ "github.com/grafana/dashboard-linter"
