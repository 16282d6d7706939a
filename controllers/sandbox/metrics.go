/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	createToReady = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "code_sandbox_create_to_ready_seconds",
		Help:    "Time from a Sandbox's creation to its container running.",
		Buckets: []float64{0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 120},
	})
	containersCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "code_sandbox_containers_created_total",
		Help: "Sandbox containers created by this manager.",
	})
	orphansRemoved = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "code_sandbox_orphans_removed_total",
		Help: "Containers removed because their Sandbox no longer exists.",
	})
	dockerErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "code_sandbox_docker_unavailable_total",
		Help: "Reconciles that found the Docker Engine unavailable.",
	})
	dockerUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "code_sandbox_docker_up",
		Help: "1 while the Docker event stream is connected.",
	})
	warmClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "code_sandbox_warm_pool_claims_total",
		Help: "Sandboxes with spec.warmPoolRef claimed by this manager, by how: warm (an idle member) or cold (created from the template).",
	}, []string{"start"})
)

func init() {
	metrics.Registry.MustRegister(createToReady, containersCreated, orphansRemoved, dockerErrors, dockerUp, warmClaims)
}

func observeCreateToReady(d time.Duration) { createToReady.Observe(d.Seconds()) }
