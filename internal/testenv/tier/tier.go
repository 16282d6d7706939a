/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package tier splits the tests into two tiers (docs/design.md, "Testing
// tiers"):
//
//   - the unit tier, `go test -short ./...` (`make test-unit`): everything
//     that needs neither a Docker Engine nor an API server;
//   - the integration tier, `go test ./...` (`make test`): all of it,
//     including the envtest suites against the real Docker Engine.
//
// A Ginkgo suite that needs Docker or an API server passes Config()... to
// RunSpecs and starts them in BeforeSuite only when NeedsIntegration()
// says so. Under -short such a suite runs only its specs labelled Unit. A
// suite that needs neither does nothing: it runs whole in both tiers.
// `make test-unit` runs with Docker and every API server unreachable, so a
// test that drifts into the wrong tier fails there instead of passing
// silently.
//
// The package imports nothing from the module, so every test package may
// use it (dockerruntime's own tests included).
package tier

import (
	"testing"

	"github.com/onsi/ginkgo/v2"
)

// Unit is the label of the specs that belong to the unit tier in a suite
// that also has integration specs.
const Unit = "unit"

// Short reports whether this run is the unit tier (go test -short).
func Short() bool { return testing.Short() }

// Config is the Ginkgo configuration to pass to RunSpecs (as
// `RunSpecs(t, description, tier.Config()...)`) in a suite that needs Docker
// or an API server: as given on the command line, and under -short narrowed
// to the specs labelled Unit.
func Config() []any {
	sc, rc := ginkgo.GinkgoConfiguration()
	if Short() {
		if sc.LabelFilter == "" {
			sc.LabelFilter = Unit
		} else {
			sc.LabelFilter = "(" + sc.LabelFilter + ") && " + Unit
		}
	}
	return []any{sc, rc}
}

// NeedsIntegration reports whether the run may select specs outside the unit
// tier, that is whether BeforeSuite must start Docker or the API server: not
// under -short, nor under a label filter that only specs labelled Unit
// pass (such as -ginkgo.label-filter=unit).
func NeedsIntegration() bool {
	if Short() {
		return false
	}
	return ginkgo.Label("integration").MatchesLabelFilter(ginkgo.GinkgoLabelFilter())
}
