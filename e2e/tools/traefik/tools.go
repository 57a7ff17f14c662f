//go:build tools

// Package tools pins the program e2e/control-plane builds from this module: Traefik, a Gateway
// API implementation that is its own data plane (pure Go), run by 'up --incremental' as the
// gateway controller of the Gateways and HTTPRoutes KubeRay creates for incremental upgrades.
package tools

import _ "github.com/traefik/traefik/v3/cmd/traefik"
