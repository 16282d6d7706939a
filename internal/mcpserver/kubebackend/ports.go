/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// AnnotationExposures is the record of a Sandbox's exposed ports (preview
// URLs): a JSON object from port to {nonce, expires}. It lives on the
// Sandbox so that every replica serves and revokes the same URLs, and ends
// with the Sandbox. Only the MCP server's ServiceAccount may write it
// (config/policy/mcp_owner_policy.yaml): a user who could would bring back
// a revoked URL by restoring its nonce. The nonce is no secret (a URL also
// needs the MAC under the owner key); readers of the Sandbox may see it.
const AnnotationExposures = "sandbox.code-sandbox.dev/mcp-exposures"

// maxExposures caps the ports one Sandbox has exposed at once, so that the
// annotation stays small (each entry is about 80 bytes).
const maxExposures = 64

type exposureRecord struct {
	Nonce   string    `json:"nonce"`
	Expires time.Time `json:"expires"`
}

var (
	_ session.PortDialer    = (*driver)(nil)
	_ session.ExposureStore = (*driver)(nil)
)

// exposures parses sbx's record. A record that does not parse exposes
// nothing (only the MCP server writes it, so that is a bug, not an attack).
func exposures(sbx *sandboxv1alpha1.Sandbox) map[string]exposureRecord {
	out := map[string]exposureRecord{}
	if v, ok := sbx.Annotations[AnnotationExposures]; ok {
		if err := json.Unmarshal([]byte(v), &out); err != nil {
			return map[string]exposureRecord{}
		}
	}
	return out
}

// DialPort implements session.PortDialer through the portforward
// subresource, with the MCP server's own credentials: the caller's right
// to do so was checked (a SubjectAccessReview for sandboxes/portforward)
// or, for a preview URL, its signature and exposure record were.
func (b *driver) DialPort(ctx context.Context, h session.Handle, port int) (contract.PortConn, error) {
	sbx, err := b.lookup(ctx, h)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return nil, err
	}
	return b.forward(ctx, sbx, port)
}

func (b *driver) forward(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, port int) (contract.PortConn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("%w: port %d is out of range (1-65535)", contract.ErrInvalid, port)
	}
	conn, err := b.nodes.PortForward(ctx, sandboxclient.For(sbx), port)
	if err != nil {
		var apiErr *sandboxclient.APIError
		if errors.As(err, &apiErr) && apiErr.Code == http.StatusBadGateway && apiErr.Details != nil {
			for _, c := range apiErr.Details.Causes {
				if c.Type == subresource.CausePortClosed {
					return nil, fmt.Errorf("%w: %s", contract.ErrPortClosed, apiErr.Message)
				}
			}
		}
		return nil, clientError(err)
	}
	return halfCloser{conn}, nil
}

// halfCloser is a forwarded connection: the upgraded stream through the
// API server cannot pass a half-close on (docs/limitations.md), so
// CloseWrite does nothing and the node API's idle cut ends the exchange.
type halfCloser struct{ io.ReadWriteCloser }

func (halfCloser) CloseWrite() error { return nil }

// Expose implements session.ExposureStore: it records nonce and expires
// for port on the caller's Sandbox, replacing the port's earlier record and
// dropping expired ones.
func (b *driver) Expose(ctx context.Context, h session.Handle, port int, nonce string, expires, now time.Time) error {
	_, err := b.editExposures(ctx, h, func(m map[string]exposureRecord) (bool, error) {
		for p, r := range m {
			if !now.Before(r.Expires) {
				delete(m, p)
			}
		}
		m[strconv.Itoa(port)] = exposureRecord{Nonce: nonce, Expires: expires.UTC().Truncate(time.Second)}
		if len(m) > maxExposures {
			return false, fmt.Errorf("%w: sandbox %q already has %d exposed ports; unexpose one first", contract.ErrInvalid, h.ID, maxExposures)
		}
		return true, nil
	})
	return err
}

// Unexpose implements session.ExposureStore.
func (b *driver) Unexpose(ctx context.Context, h session.Handle, port int) (bool, error) {
	return b.editExposures(ctx, h, func(m map[string]exposureRecord) (bool, error) {
		_, had := m[strconv.Itoa(port)]
		delete(m, strconv.Itoa(port))
		return had, nil
	})
}

// editExposures applies edit to the caller's Sandbox's record, read live,
// and writes it back with the resourceVersion it read, so that two
// replicas exposing ports of one Sandbox at once both land. edit's bool is
// whether anything changed (and, for Unexpose, the answer).
func (b *driver) editExposures(ctx context.Context, h session.Handle, edit func(map[string]exposureRecord) (bool, error)) (bool, error) {
	if _, err := b.lookup(ctx, h); err != nil {
		return false, err
	}
	key := client.ObjectKey{Namespace: b.namespaceFor(h.Caller), Name: h.ID}
	for range 20 {
		var sbx sandboxv1alpha1.Sandbox
		if err := b.kube.Get(ctx, key, &sbx); err != nil {
			if apierrors.IsNotFound(err) {
				return false, notFound(h.ID)
			}
			return false, apiError("reading sandbox "+h.ID, err)
		}
		if !owns(h.Caller, &sbx) {
			return false, notFound(h.ID)
		}
		m := exposures(&sbx)
		changed, err := edit(m)
		if err != nil || !changed {
			return changed, err
		}
		record, err := json.Marshal(m)
		if err != nil {
			return false, err
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": sbx.ResourceVersion,
			"annotations":     map[string]string{AnnotationExposures: string(record)},
		}})
		if err != nil {
			return false, err
		}
		switch err := b.kube.Patch(ctx, &sbx, client.RawPatch(client.Merge.Type(), patch)); {
		case err == nil:
			return true, nil
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return false, notFound(h.ID)
		default:
			return false, apiError("recording the exposed ports of sandbox "+h.ID, err)
		}
	}
	return false, fmt.Errorf("%w: the exposed ports of sandbox %q kept changing; try again", contract.ErrUnavailable, h.ID)
}

// exposed returns x's Sandbox when x is its port's current, unexpired
// exposure: the owner label must be x.Owner (the URL's signed owner hash)
// and the record must hold x's nonce. The Sandbox comes from the cache,
// read from the API server on a miss or when the cached record refuses, so
// a URL exposed through another replica works here at once, and a
// revocation through another replica takes effect here as soon as this
// replica's cache sees it.
func (b *driver) exposed(ctx context.Context, x contract.Exposure, now time.Time) (*sandboxv1alpha1.Sandbox, error) {
	if !validID(x.ID) {
		return nil, notFound(x.ID)
	}
	sbx, err := b.findExposed(ctx, x)
	if err != nil {
		return nil, err
	}
	if err := grants(sbx, x, now); !errors.Is(err, contract.ErrNotExposed) {
		return sbx, err
	}
	// The cache may not have the record yet: a URL exposed through
	// another replica a moment ago. A refusal is read again from the API
	// server (only a URL whose MAC verified gets here).
	var fresh sandboxv1alpha1.Sandbox
	if err := b.kube.Get(ctx, client.ObjectKeyFromObject(sbx), &fresh); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notFound(x.ID)
		}
		return nil, apiError("reading sandbox "+x.ID, err)
	}
	return &fresh, grants(&fresh, x, now)
}

// grants is nil when sbx is x's live Sandbox and its record holds x's
// nonce for x's port, unexpired.
func grants(sbx *sandboxv1alpha1.Sandbox, x contract.Exposure, now time.Time) error {
	if sbx.DeletionTimestamp != nil || sbx.Labels[LabelOwner] != x.Owner {
		return notFound(x.ID)
	}
	rec, ok := exposures(sbx)[strconv.Itoa(x.Port)]
	if !ok || subtle.ConstantTimeCompare([]byte(rec.Nonce), []byte(x.Nonce)) != 1 || !now.Before(rec.Expires) {
		return fmt.Errorf("%w: port %d of sandbox %q", contract.ErrNotExposed, x.Port, x.ID)
	}
	return nil
}

// findExposed reads x's Sandbox. With one namespace it is a Get (cache,
// then API server); when callers' Sandboxes live in namespaces of their
// own, the URL does not name the namespace, so the cache (which then
// watches every namespace) is searched for the owner's Sandbox of that name.
func (b *driver) findExposed(ctx context.Context, x contract.Exposure) (*sandboxv1alpha1.Sandbox, error) {
	if ns := b.sweepNamespace(); ns != "" {
		var sbx sandboxv1alpha1.Sandbox
		if err := b.getSandbox(ctx, client.ObjectKey{Namespace: ns, Name: x.ID}, &sbx); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, notFound(x.ID)
			}
			return nil, apiError("reading sandbox "+x.ID, err)
		}
		return &sbx, nil
	}
	var list sandboxv1alpha1.SandboxList
	if err := b.reader().List(ctx, &list, client.MatchingLabels{LabelOwner: x.Owner}); err != nil {
		return nil, apiError("listing sandboxes", err)
	}
	for i := range list.Items {
		if list.Items[i].Name == x.ID {
			return &list.Items[i], nil
		}
	}
	return nil, notFound(x.ID)
}

func validID(id string) bool {
	return len(id) > len(NamePrefix) && id[:len(NamePrefix)] == NamePrefix && len(validation.IsDNS1123Label(id)) == 0
}

// CheckExposed implements session.ExposureStore.
func (b *driver) CheckExposed(ctx context.Context, x contract.Exposure, now time.Time) error {
	_, err := b.exposed(ctx, x, now)
	return err
}

// DialExposed implements session.ExposureStore: the URL is the bearer and
// the MCP server acts, with its own credentials. It resumes a paused
// Sandbox, as a command would.
func (b *driver) DialExposed(ctx context.Context, x contract.Exposure, now time.Time) (contract.PortConn, error) {
	sbx, err := b.exposed(ctx, x, now)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return nil, err
	}
	return b.forward(ctx, sbx, x.Port)
}
