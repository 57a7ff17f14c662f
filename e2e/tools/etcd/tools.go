//go:build tools

// Package tools pins the program e2e/setup builds from this module.
package tools

import _ "go.etcd.io/etcd/server/v3"
