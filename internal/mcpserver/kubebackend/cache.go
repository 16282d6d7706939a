/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// The informer cache of the MCP Sandboxes: every replica lists, counts and
// finds an identity's Sandboxes from it, whichever replica made them, without
// a List per call.
//
// It holds only the Sandboxes that carry the owner label (LabelOwner exists),
// not every Sandbox of the namespace: memory grows with the MCP Sandboxes
// alone, and managedFields are stripped. The selector is the owner label, not
// the managed-by label, because the VAP config/policy/mcp_owner_policy.yaml
// keeps the owner label immutable and only the MCP server's to set: a
// namespace user could take app.kubernetes.io/managed-by off a Sandbox (and
// so out of a cache selected by it, and out of its owner's count), but can
// neither remove the owner label nor put it on a Sandbox of their own.

// ownedSelector selects the MCP Sandboxes.
func ownedSelector() labels.Selector {
	req, err := labels.NewRequirement(LabelOwner, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant label key
	}
	return labels.NewSelector().Add(*req)
}

// newSandboxCache returns the cache of the MCP Sandboxes in namespace ("":
// every namespace, for NamespaceFromServiceAccount).
func newSandboxCache(cfg *rest.Config, scheme *runtime.Scheme, namespace string) (cache.Cache, error) {
	opts := cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&sandboxv1alpha1.Sandbox{}: {Label: ownedSelector()},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
		// Only Sandboxes are read through the cache; anything else would
		// start an informer nobody bounded.
		ReaderFailOnMissingInformer: true,
	}
	if namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("kubebackend: Sandbox cache: %w", err)
	}
	// Registered now, so that Start starts it and WaitForCacheSync waits
	// for it.
	if _, err := c.GetInformer(context.Background(), &sandboxv1alpha1.Sandbox{}); err != nil {
		return nil, fmt.Errorf("kubebackend: Sandbox informer: %w", err)
	}
	return c, nil
}

// sandboxCache is the driver's view of the cache: unsynced, it is not used
// (reads go to the API server).
type sandboxCache struct {
	c      cache.Cache
	synced atomic.Bool
}

// start runs the cache until ctx ends and marks it synced once it is.
func (s *sandboxCache) start(ctx context.Context, log interface{ Error(string, ...any) }) {
	if s == nil || s.c == nil {
		return
	}
	go func() {
		if err := s.c.Start(ctx); err != nil {
			log.Error("the Sandbox cache stopped", "error", err)
		}
	}()
	go func() {
		if s.c.WaitForCacheSync(ctx) {
			s.synced.Store(true)
		}
	}()
}

var errCacheNotSynced = errors.New("the Sandbox cache has not synced yet")

// reader returns the cache once synced, else the API server.
func (b *driver) reader() client.Reader {
	if b.cache != nil && b.cache.synced.Load() {
		return b.cache.c
	}
	return b.kube
}

// getSandbox reads a Sandbox from the cache, and from the API server when the
// cache does not have it (one another replica created a moment ago, which
// the cache has not seen yet).
func (b *driver) getSandbox(ctx context.Context, key client.ObjectKey, sbx *sandboxv1alpha1.Sandbox) error {
	r := b.reader()
	err := r.Get(ctx, key, sbx)
	if r == client.Reader(b.kube) {
		return err
	}
	if apierrors.IsNotFound(err) {
		return b.kube.Get(ctx, key, sbx)
	}
	// The cache may lag behind a Sandbox that became Ready a moment ago:
	// sandbox_initialize watched it become Ready (maybe on another
	// replica), and the agent's next call must not be told it is still
	// provisioning. A copy that cannot take commands is read again from
	// the API server before anyone acts on it (seen on kind under load:
	// an exec right after sandbox_initialize refused as "Provisioning").
	if err == nil && sandboxclient.CheckReady(sbx) != nil {
		var fresh sandboxv1alpha1.Sandbox
		switch ferr := b.kube.Get(ctx, key, &fresh); {
		case ferr == nil:
			*sbx = fresh
		case apierrors.IsNotFound(ferr):
			return ferr
		}
	}
	return err
}

// ownedSandboxes lists caller's live Sandboxes in namespace from the cache.
func (b *driver) ownedSandboxes(ctx context.Context, namespace string, caller contract.Caller) ([]sandboxv1alpha1.Sandbox, error) {
	var list sandboxv1alpha1.SandboxList
	if err := b.reader().List(ctx, &list, client.InNamespace(namespace), ownerSelector(caller)); err != nil {
		return nil, err
	}
	out := list.Items[:0]
	for i := range list.Items {
		if owns(caller, &list.Items[i]) {
			out = append(out, list.Items[i])
		}
	}
	return out, nil
}
