// Command opa is bin/opa: OPA with the Envoy ext_authz plugin (opa-envoy-plugin), registered as
// the plugin's own cmd/opa-envoy-plugin registers it, and one setting more: the plugin's gRPC
// server takes checks on lasting worker goroutines, as many as the process's GOMAXPROCS (the
// point's concurrency), instead of a new goroutine per check.
//
// Why: a new goroutine starts with a small stack, and a decision's evaluation is deep, so Go copied
// the stack (every frame adjusted) at each doubling on every check: 12-20 % of an enforcement
// point's OPA CPU (docs/cost.md). grpc-go's NumStreamWorkers keeps the grown stack from one check to
// the next; a check arriving while every worker is busy still gets a goroutine of its own. The
// plugin builds its server from its configuration only, with no option for this, so it is set as a
// global server option, which grpc.NewServer applies to every server the process makes (the
// plugin's is the only one). grpc-go keeps those in an unexported variable that its internal
// package alone appends to; the link name reaches it, and a grpc-go that renames it fails the
// build (go.mod pins the version). tests/integration/proxy/test_opa_binary.py counts the workers.
package main

import (
	"os"
	"runtime"
	_ "unsafe" // for go:linkname

	"github.com/open-policy-agent/opa-envoy-plugin/plugin"
	"github.com/open-policy-agent/opa/cmd"
	opa "github.com/open-policy-agent/opa/v1/runtime"
	"google.golang.org/grpc"
)

//go:linkname globalServerOptions google.golang.org/grpc.globalServerOptions
var globalServerOptions []grpc.ServerOption

func main() {
	globalServerOptions = append(globalServerOptions, grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))
	opa.RegisterPlugin("envoy.ext_authz.grpc", plugin.Factory{}) // the plugin's older name, as its own command registers it
	opa.RegisterPlugin(plugin.PluginName, plugin.Factory{})
	if err := cmd.RootCommand.Execute(); err != nil {
		os.Exit(1)
	}
}
