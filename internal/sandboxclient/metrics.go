/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// maxMetricsBody bounds the answer read: a Metrics is a few hundred bytes.
const maxMetricsBody = 64 << 10

// Metrics reads the Sandbox's resource use now (GET sandboxes/metrics;
// RBAC get sandboxes/metrics). It is served for a paused Sandbox too, and
// does not wake it. It takes about a second: the node samples the CPU
// counters twice.
func (c *Client) Metrics(ctx context.Context, ref Ref) (subresource.Metrics, error) {
	ns, name := ref.key()
	resp, err := c.do(ctx, ref, request{method: http.MethodGet, subresource: subresource.SubresourceMetrics, accept: "application/json"})
	if err != nil {
		return subresource.Metrics{}, err
	}
	defer resp.Body.Close()
	var m subresource.Metrics
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxMetricsBody)).Decode(&m); err != nil {
		return subresource.Metrics{}, fmt.Errorf("sandbox %s/%s: decoding metrics: %w", ns, name, err)
	}
	if m.Version != subresource.MetricsVersion {
		return subresource.Metrics{}, fmt.Errorf("sandbox %s/%s: metrics of version %q, this client reads %q", ns, name, m.Version, subresource.MetricsVersion)
	}
	return m, nil
}

// maxListBody bounds a Sandbox list read by SandboxNames.
const maxListBody = 64 << 20

// SandboxNames lists the names of the Sandboxes in ns (RBAC: list
// sandboxes), sorted, for commands that act on all of them.
func (c *Client) SandboxNames(ctx context.Context, ns string) ([]string, error) {
	if err := validateNames(ns, "x"); err != nil {
		return nil, err
	}
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/apis/" + sandboxv1alpha1.GroupVersion.Group + "/" + sandboxv1alpha1.GroupVersion.Version + "/namespaces/" + ns + "/sandboxes"
	u.RawPath, u.RawQuery = "", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportError(ns, "", c.base.Host, "list", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, decodeErrorResponse(ns, "", resp)
	}
	var list sandboxv1alpha1.SandboxList
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxListBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("namespace %s: decoding the Sandbox list: %w", ns, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names, nil
}
