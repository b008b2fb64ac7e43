//go:build tools

// Package tools records the tool dependency so `go mod tidy` keeps it pinned in go.mod and go.sum.
package tools

import (
	_ "github.com/coredns/coredns"
)
