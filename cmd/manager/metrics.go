/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// metricsSecure is --metrics-secure.
var metricsSecure = true

// metricsOptions serves the metrics over HTTPS (a self-signed certificate)
// and lets only callers the API server authenticates, and authorizes for
// GET /metrics (nonResourceURLs, the metrics-reader ClusterRole), read
// them: TokenReview and SubjectAccessReview, as kubebuilder scaffolds it.
func metricsOptions(addr string) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr, SecureServing: metricsSecure}
	if metricsSecure {
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
		// No HTTP/2 (CVE-2023-44487, CVE-2023-39325).
		opts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return opts
}
