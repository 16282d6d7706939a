/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

var upgradeMu sync.Mutex

// upgradeClient is an HTTP/1.1-only client with c's credentials: an
// upgrade cannot ride HTTP/2, which kube-apiserver would otherwise
// negotiate.
func (c *Client) upgradeClient() (*http.Client, error) {
	upgradeMu.Lock()
	defer upgradeMu.Unlock()
	if c.upgrade != nil {
		return c.upgrade, nil
	}
	cfg := rest.CopyConfig(c.cfg)
	cfg.NextProtos = []string{"http/1.1"}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("sandboxclient: credentials from the rest.Config: %w", err)
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.upgrade = hc
	return hc, nil
}

// PortForward opens one TCP connection to 127.0.0.1:port inside the
// Sandbox, through the portforward subresource (an HTTP/1.1 upgrade that
// kube-apiserver and the aggregated API server pass on). Closing the
// returned stream ends the connection. A refusal is an *APIError: a
// closed port is 502 with the cause subresource.CausePortClosed.
func (c *Client) PortForward(ctx context.Context, ref Ref, port int) (io.ReadWriteCloser, error) {
	ns, name := ref.key()
	if err := validateNames(ns, name); err != nil {
		return nil, err
	}
	if ref.Sandbox != nil {
		if err := CheckReady(ref.Sandbox); err != nil {
			return nil, err
		}
	}
	hc, err := c.upgradeClient()
	if err != nil {
		return nil, err
	}
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + subresource.AggregatedPathPrefix + ns + "/sandboxes/" + name + "/" + subresource.SubresourcePortForward
	u.RawPath = ""
	u.RawQuery = url.Values{subresource.QueryPort: {strconv.Itoa(port)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s/%s: building the portforward request: %w", ns, name, err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", subresource.PortForwardProtocol)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, transportError(ns, name, c.base.Host, subresource.SubresourcePortForward, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
			return nil, fmt.Errorf("sandbox %s/%s: portforward answered %s instead of switching protocols", ns, name, resp.Status)
		}
		return nil, decodeErrorResponse(ns, name, resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("sandbox %s/%s: the upgraded portforward connection is not writable", ns, name)
	}
	return rwc, nil
}
