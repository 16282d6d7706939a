package main

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

func TestPrintTop(t *testing.T) {
	running := subresource.Metrics{
		CPU:    subresource.CPUMetrics{Cores: 0.49, LimitCores: 0.5, PercentOfLimit: 98},
		Memory: subresource.UsageMetrics{Used: 120 << 20, Limit: 128 << 20},
		Pids:   subresource.UsageMetrics{Used: 3, Limit: 256},
		Disk: subresource.DiskMetrics{UsedBytes: 8 << 20, Paths: []subresource.PathMetrics{
			{Path: "/app", LimitBytes: 256 << 20}, {Path: "/tmp", LimitBytes: 256 << 20}, {Path: "/var/tmp", LimitBytes: 256 << 20}}},
		Network: &subresource.NetworkMetrics{RxBytes: 2048, TxBytes: 10},
	}
	paused := running
	paused.Paused, paused.Network, paused.CPU.Cores, paused.CPU.PercentOfLimit = true, nil, 0, 0
	app, tmp, vartmp := int64(3<<20), int64(5<<20), int64(0)
	running.Disk.Paths = []subresource.PathMetrics{
		{Path: "/app", LimitBytes: 256 << 20, UsedBytes: &app}, {Path: "/tmp", LimitBytes: 256 << 20, UsedBytes: &tmp}, {Path: "/var/tmp", LimitBytes: 256 << 20, UsedBytes: &vartmp}}
	refused := &sandboxclient.APIError{Code: http.StatusConflict, Reason: metav1.StatusReasonConflict,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: subresource.CauseContainerNotRunning}}}}
	var out bytes.Buffer
	if err := printTop(&out, []topRow{{name: "busy", m: running}, {name: "asleep", m: paused}, {name: "gone", err: refused}, {name: "odd", err: errors.New("x")}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("table:\n%s", out.String())
	}
	for i, want := range [][]string{
		{"busy", "0.490/0.5", "98%", "120.0Mi/128.0Mi", "94%", "3/256", "8.0Mi/768.0Mi", "/app=3.0Mi,/tmp=5.0Mi,/var/tmp=0", "2.0Ki/10", "Running"},
		{"asleep", "0.000/0.5", "0%", "8.0Mi/768.0Mi", "-", "Paused"},
		{"gone", string(subresource.CauseContainerNotRunning)},
		{"odd", "Error"},
	} {
		fields := strings.Fields(lines[i+1])
		for _, w := range want {
			found := false
			for _, f := range fields {
				found = found || f == w
			}
			if !found {
				t.Errorf("row %q lacks %q", lines[i+1], w)
			}
		}
	}
}
