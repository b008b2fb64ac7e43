// The complyroute-bundles command: every enforcement point's bundle of one rule set, built and
// signed in one process, each byte for byte what `opa build --bundle . --signing-key <key>
// --signing-alg <alg>` writes from a folder holding the rule set's files, the point's data.json
// and its .manifest (complyroute/policy/bundles.py, which asks it; tests/unit/policy/test_bundles.py
// compares the two).
//
// Why: an `opa build` a point loaded, parsed, compiled and formatted the same rule set again, in
// a process of its own: about 30 ms of CPU a point, 1.5 s of a sidecar deployment of 50 services
// and as much of each reload's first step. Here the rule set is loaded, compiled and formatted
// once, with OPA's own loader, compiler and bundle package, as `opa build` does it; each point then
// costs its data, the signature and the archive.
//
// The request, JSON on standard input:
//
//	{"rules": <folder of the rule set's files>, "signing_key": <PEM file>, "signing_alg": "RS256",
//	 "output": <folder>, "points": {<name>: {"file": <file name>, "manifest": <.manifest>, "data": <data.json>}}}
//
// Each point's bundle is written to <output>/<file>.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/compile"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/spf13/cobra"
)

// The key id opa build names in a signature it makes, unless told another (--verification-key-id).
const signingKeyID = "default"

type pointBundle struct {
	File     string          `json:"file"`
	Manifest bundle.Manifest `json:"manifest"`
	Data     map[string]any  `json:"data"`
}

type bundlesRequest struct {
	Rules      string                 `json:"rules"`
	SigningKey string                 `json:"signing_key"`
	SigningAlg string                 `json:"signing_alg"`
	Output     string                 `json:"output"`
	Points     map[string]pointBundle `json:"points"`
}

func bundlesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "complyroute-bundles",
		Short: "Build and sign every enforcement point's bundle of one rule set, as opa build does one (request: JSON on stdin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var request bundlesRequest
			decoder := json.NewDecoder(os.Stdin)
			decoder.UseNumber() // numbers as opa build's loader reads them, so that they are written alike
			if err := decoder.Decode(&request); err != nil {
				return fmt.Errorf("the request on standard input: %w", err)
			}
			return writeBundles(cmd.Context(), request)
		},
	}
}

func writeBundles(ctx context.Context, request bundlesRequest) error {
	// The rule set as opa build loads a bundle folder (its modules parsed, its data files at
	// their paths), compiled (a rule set that does not compile is refused) and its modules
	// formatted, as opa build does before it signs.
	// opa build's settings: OPA's capabilities, Rego v1, the METADATA entrypoints read.
	capabilities := ast.CapabilitiesForThisVersion()
	// From inside the folder, as `opa build --bundle .` runs, so that every module's path is the bundle's own.
	rules, err := loader.NewFileLoader().WithFS(os.DirFS(request.Rules)).WithRegoVersion(ast.RegoV1).
		WithCapabilities(capabilities).WithProcessAnnotation(true).AsBundle(".")
	if err != nil {
		return err
	}
	err = compile.New().WithCapabilities(capabilities).WithRegoVersion(ast.RegoV1).WithRegoAnnotationEntrypoints(true).
		WithBundle(rules).Build(ctx)
	if err != nil {
		return err
	}
	signing := bundle.NewSigningConfig(request.SigningKey, request.SigningAlg, "")
	for _, name := range slices.Sorted(maps.Keys(request.Points)) {
		point := request.Points[name]
		if point.File == "" || strings.ContainsAny(point.File, `/\`) || strings.HasPrefix(point.File, ".") {
			return fmt.Errorf("point %s: its bundle's name %q is no file name in the output folder", name, point.File)
		}
		data, err := merged(rules.Data, point.Data, "data")
		if err != nil {
			return fmt.Errorf("point %s: %w", name, err)
		}
		// The modules are shared, read only: signing hashes them and the writer copies them out.
		built := bundle.Bundle{Manifest: point.Manifest, Data: data, Modules: rules.Modules}
		built.Manifest.Init()
		built.SetRegoVersion(ast.RegoV1)
		built.Manifest.SetRegoVersion(ast.RegoV1)
		if err := built.GenerateSignature(signing, signingKeyID, false); err != nil {
			return fmt.Errorf("point %s: signing its bundle: %w", name, err)
		}
		if err := writeBundle(filepath.Join(request.Output, point.File), built); err != nil {
			return fmt.Errorf("point %s: %w", name, err)
		}
	}
	return nil
}

func writeBundle(path string, built bundle.Bundle) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bundle.NewWriter(file).Write(built); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}

// merged is `base` with `point` merged in, object by object, as opa build's loader merges the data
// files of a bundle folder: a document both hold, not both as objects, is a conflict (`at` names it).
func merged(base, point map[string]any, at string) (map[string]any, error) {
	result := maps.Clone(base)
	if result == nil {
		result = map[string]any{}
	}
	for key, value := range point {
		existing, found := result[key]
		if !found {
			result[key] = value
			continue
		}
		existingObject, isObject := existing.(map[string]any)
		valueObject, valueIsObject := value.(map[string]any)
		if !isObject || !valueIsObject {
			return nil, fmt.Errorf("%s.%s is both the rule set's and the point's", at, key)
		}
		inner, err := merged(existingObject, valueObject, at+"."+key)
		if err != nil {
			return nil, err
		}
		result[key] = inner
	}
	return result, nil
}
