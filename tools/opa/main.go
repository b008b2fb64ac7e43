// Command opa is bin/opa: OPA with the Envoy ext_authz plugin (opa-envoy-plugin), registered as
// the plugin's own cmd/opa-envoy-plugin registers it, and two settings more for the plugin's gRPC
// server: it takes checks on lasting worker goroutines, as many as the process's GOMAXPROCS (1 at
// every point: GO_RUNTIME in complyroute/policy/policyfiles.py), instead of a new goroutine per
// check; and its flow-control windows are fixed (below, where they are set).
//
// Why: a new goroutine starts with a small stack, and a decision's evaluation is deep, so Go copied
// the stack (every frame adjusted) at each doubling on every check: 12-20 % of an enforcement
// point's OPA CPU (docs/cost.md). grpc-go's NumStreamWorkers keeps the grown stack from one check to
// the next; a check arriving while every worker is busy still gets a goroutine of its own. The
// plugin builds its server from its configuration only, with no option for either, so they are set
// as global server options, which grpc.NewServer applies to every server the process makes (the
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
	globalServerOptions = append(globalServerOptions,
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// Fixed flow-control windows: grpc-go then estimates no bandwidth-delay product, which
		// pinged Envoy on the data of a check whenever no ping was out (an extra frame written and
		// its acknowledgement read, a check at a time). 1 MiB holds many of the largest check (a
		// record is at most 64 KiB: proxy/contract.py MAX_RECORD_BYTES).
		grpc.InitialWindowSize(1<<20),
		grpc.InitialConnWindowSize(1<<20),
	)
	opa.RegisterPlugin("envoy.ext_authz.grpc", plugin.Factory{}) // the plugin's older name, as its own command registers it
	opa.RegisterPlugin(plugin.PluginName, plugin.Factory{})
	cmd.RootCommand.AddCommand(bundlesCommand()) // every point's bundle in one process: bundles.go
	if err := cmd.RootCommand.Execute(); err != nil {
		os.Exit(1)
	}
}
