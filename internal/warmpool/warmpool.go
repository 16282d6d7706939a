/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package warmpool holds what the pool controller, the node managers and the
// quota webhook must agree on about SandboxWarmPools: which Sandboxes are a
// pool's members, the template hash, and how a template becomes a Sandbox
// spec.
package warmpool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// Hash identifies a template: members whose LabelTemplateHash differs from
// the pool's current Hash are stale, and a claim only takes a member made
// from the template the claim records.
func Hash(t sandboxv1alpha1.SandboxTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// A struct of strings, quantities and slices always marshals.
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// Selector is the label selector of a pool's members, as the scale
// subresource publishes it.
func Selector(pool *sandboxv1alpha1.SandboxWarmPool) labels.Selector {
	return labels.SelectorFromSet(labels.Set{sandboxv1alpha1.LabelWarmPool: pool.Name})
}

// Replicas is spec.replicas with its default.
func Replicas(pool *sandboxv1alpha1.SandboxWarmPool) int32 {
	return ptr.Deref(pool.Spec.Replicas, 1)
}

// IsMemberOf reports whether sbx is a member the pool controller created for
// pool: the label and a controller ownerReference to the pool's UID. The
// label alone is only an index.
func IsMemberOf(sbx *sandboxv1alpha1.Sandbox, pool *sandboxv1alpha1.SandboxWarmPool) bool {
	if sbx.Labels[sandboxv1alpha1.LabelWarmPool] != pool.Name || sbx.Namespace != pool.Namespace {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(sbx)
	return ref != nil && ref.UID == pool.UID && ref.Kind == "SandboxWarmPool" &&
		ref.APIVersion == sandboxv1alpha1.GroupVersion.String()
}

// PoolOf returns the name of the pool sbx claims to be a member of (by its
// controller ownerReference), or "".
func PoolOf(sbx *sandboxv1alpha1.Sandbox) string {
	ref := metav1.GetControllerOfNoCopy(sbx)
	if ref == nil || ref.Kind != "SandboxWarmPool" || ref.APIVersion != sandboxv1alpha1.GroupVersion.String() {
		return ""
	}
	if sbx.Labels[sandboxv1alpha1.LabelWarmPool] != ref.Name {
		return ""
	}
	return ref.Name
}

// Idle reports whether a member is ready to be claimed: bound, provisioned,
// frozen (Ready=False/Paused and Paused=True, which the manager sets only
// once the container is frozen), not deleting and not claimed.
func Idle(sbx *sandboxv1alpha1.Sandbox) bool {
	if !sbx.DeletionTimestamp.IsZero() || sbx.Status.NodeName == "" || sbx.Status.ContainerID == "" {
		return false
	}
	// Ready says Paused only while the manager last saw the container
	// frozen; a claimed, missing or dead member's Ready says otherwise even
	// though its Paused condition may still be True.
	ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if ready == nil || ready.Reason != sandboxv1alpha1.SandboxReasonPaused {
		return false
	}
	return meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
}

// Member builds a new member Sandbox for pool: the template's shape,
// spec.paused, the labels, and the pool as its controller (so that garbage
// collection removes members with their pool).
func Member(pool *sandboxv1alpha1.SandboxWarmPool) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    pool.Namespace,
			GenerateName: pool.Name + "-",
			Labels: map[string]string{
				sandboxv1alpha1.LabelWarmPool:     pool.Name,
				sandboxv1alpha1.LabelTemplateHash: Hash(pool.Spec.Template),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         sandboxv1alpha1.GroupVersion.String(),
				Kind:               "SandboxWarmPool",
				Name:               pool.Name,
				UID:                pool.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
	}
	ApplyTemplate(&sbx.Spec, pool.Spec.Template)
	sbx.Spec.Paused = true
	return sbx
}

// ApplyTemplate sets the shape fields of spec from t and clears
// warmPoolRef: the spec a container made from t runs with.
func ApplyTemplate(spec *sandboxv1alpha1.SandboxSpec, t sandboxv1alpha1.SandboxTemplate) {
	t = *t.DeepCopy()
	spec.WarmPoolRef = nil
	spec.Image = t.Image
	spec.ImagePullPolicy = t.ImagePullPolicy
	spec.Command = t.Command
	spec.WorkingDir = t.WorkingDir
	spec.User = t.User
	spec.Resources = t.Resources
	spec.Network = t.Network
	spec.Runtime = t.Runtime
}

// Matches reports whether spec is what Member makes from t, in everything
// that reaches the container: the template's shape (image, pull policy,
// command, workingDir, user, resources, network, runtime), no env (it is
// baked into the container) and no claim of its own. spec.paused, the
// lifetime and nodeName do not shape the container and are not compared.
//
// Labels say which template a member was made from, but whoever can create
// a Sandbox can write labels and ownerReferences; the spec is what the
// container was made from (the shape fields are immutable), so a claim
// checks the spec.
func Matches(spec *sandboxv1alpha1.SandboxSpec, t sandboxv1alpha1.SandboxTemplate) bool {
	want := spec.DeepCopy()
	ApplyTemplate(want, t)
	want.Env = nil
	// Semantic: quantities by value, nil and empty lists alike.
	return apiequality.Semantic.DeepEqual(want, spec)
}

// MatchesStripped is Matches for a Sandbox read from a cache that drops
// command and env (sandbox.StripForeign in controllers/sandbox: the control-plane role's cache, and
// a node manager's for Sandboxes of other nodes): everything else of the
// shape is compared. It serves bookkeeping (the pool controller's fresh
// members, the count of idle members elsewhere); the manager that hands a
// member out compares the whole spec with Matches, and holds its own
// node's members whole.
func MatchesStripped(spec *sandboxv1alpha1.SandboxSpec, t sandboxv1alpha1.SandboxTemplate) bool {
	s := spec.DeepCopy()
	s.Command = nil
	t.Command = nil
	return Matches(s, t)
}

// Effective returns the spec the Sandbox's container runs with: its own,
// or for a claiming Sandbox, its spec with the shape of the template the
// manager recorded at the claim. ok is false for a claiming Sandbox that no
// manager has claimed yet.
func Effective(sbx *sandboxv1alpha1.Sandbox) (spec sandboxv1alpha1.SandboxSpec, ok bool) {
	spec = *sbx.Spec.DeepCopy()
	if sbx.Spec.WarmPoolRef == nil {
		return spec, true
	}
	if sbx.Status.WarmPool == nil || sbx.Status.WarmPool.Template == nil {
		return spec, false
	}
	ApplyTemplate(&spec, *sbx.Status.WarmPool.Template)
	return spec, true
}

// Templates are the current templates of a namespace's pools, by name.
type Templates map[string]*sandboxv1alpha1.SandboxTemplate

// TemplatesOf indexes pools' templates by pool name.
func TemplatesOf(pools []sandboxv1alpha1.SandboxWarmPool) Templates {
	out := make(Templates, len(pools))
	for i := range pools {
		out[pools[i].Name] = &pools[i].Spec.Template
	}
	return out
}

// Charged returns sbx as a SandboxQuota charges and checks it: the Sandbox
// its container runs as. A claimant is charged with the template its
// manager recorded at the claim (Effective: later edits of the pool do not
// reach a container that exists), or before the claim with its pool's
// current template, which is what the container will be made from. With
// neither (the pool is gone) its own spec is all there is. The result is
// sbx itself or a copy; it must not be modified.
func Charged(sbx *sandboxv1alpha1.Sandbox, templates Templates) *sandboxv1alpha1.Sandbox {
	if sbx.Spec.WarmPoolRef == nil {
		return sbx
	}
	if spec, ok := Effective(sbx); ok {
		out := sbx.DeepCopy()
		out.Spec = spec
		return out
	}
	if t := templates[sbx.Spec.WarmPoolRef.Name]; t != nil {
		out := sbx.DeepCopy()
		ApplyTemplate(&out.Spec, *t)
		return out
	}
	return sbx
}
