/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// EgressProxy is what the reconciler needs from the node's egress proxy
// (internal/egressproxy): a policy per sandbox, keyed by the sandbox's
// address on the egress bridge. *egressproxy.Node (the proxy with the
// firewall that redirects to it) implements it.
type EgressProxy interface {
	SetPolicy(src netip.Addr, p egressproxy.Policy) error
	// RemovePolicy fails closed by itself: a firewall it cannot update
	// keeps redirecting the address to the proxy, which refuses it.
	RemovePolicy(src netip.Addr)
	// CAPEM is the certificate sandboxes whose policy injects must trust
	// (the proxy terminates their TLS); nil without a CA.
	CAPEM() []byte
}

var _ EgressProxy = (*egressproxy.Node)(nil)

// egressSecretRecheck is how often a running sandbox's policy is rebuilt
// when it injects credentials, so that a rotated Secret reaches the proxy
// without a change to the Sandbox (the manager does not watch Secrets: it
// may only get the ones a namespace grants it, see docs/egress.md).
const egressSecretRecheck = 5 * time.Minute

// egressTable remembers which container holds which address on the egress
// bridge, so that a policy never outlives its container: Docker reuses
// addresses, and a stale policy (with its credentials) must never apply to
// the next container that gets the address.
type egressTable struct {
	mu     sync.Mutex
	byID   map[string]netip.Addr
	byAddr map[netip.Addr]string
}

func newEgressTable() *egressTable {
	return &egressTable{byID: map[string]netip.Addr{}, byAddr: map[netip.Addr]string{}}
}

// take records that container id holds addr and returns the address's
// previous holder, if another container.
func (t *egressTable) take(id string, addr netip.Addr) (prevAddr netip.Addr, prevHolder string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[id]; ok && old != addr {
		delete(t.byAddr, old)
		prevAddr = old
	}
	if h, ok := t.byAddr[addr]; ok && h != id {
		prevHolder = h
		delete(t.byID, h)
	}
	t.byID[id] = addr
	t.byAddr[addr] = id
	return prevAddr, prevHolder
}

// forget drops container id and returns the address it held.
func (t *egressTable) forget(id string) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.byID[id]
	if ok {
		delete(t.byID, id)
		delete(t.byAddr, a)
	}
	return a, ok
}

// forgetEgress removes the policy of container id, if it had one. Called
// whenever a container stops or goes (removal, a die or destroy event).
func (r *SandboxReconciler) forgetEgress(ctx context.Context, id string) {
	if r.opts.EgressProxy == nil {
		return
	}
	if a, ok := r.egress.forget(id); ok {
		r.opts.EgressProxy.RemovePolicy(a)
	}
}

// egressPolicyOf is the policy the container of sbx runs under: the pool
// template's for a claimant (warmpool.Effective), else its own; nil when
// the sandbox has unrestricted egress or no network.
func egressPolicyOf(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.EgressPolicy {
	spec, _ := warmpool.Effective(sbx)
	if spec.Network.Mode != sandboxv1alpha1.NetworkEgress {
		return nil
	}
	return spec.Network.Egress
}

// needsEgressProxy reports whether sbx may only be created on a node with
// an egress proxy: a sandbox with a policy must never run unrestricted.
func needsEgressProxy(sbx *sandboxv1alpha1.Sandbox) bool { return egressPolicyOf(sbx) != nil }

// egressInjects reports whether sbx's policy injects a credential: the
// proxy then terminates its TLS, and the container must trust the proxy's
// CA (EgressCAEnv at create, installEgressCA after start).
func egressInjects(sbx *sandboxv1alpha1.Sandbox) bool {
	pol := egressPolicyOf(sbx)
	if pol == nil {
		return false
	}
	for _, rule := range pol.Allow {
		if rule.Inject != nil {
			return true
		}
	}
	return false
}

// installEgressCA puts the proxy's CA into a new container of a sandbox
// whose policy injects, through the helper (never the image). Until it is
// there, TLS to an injected host fails verification: closed, not open.
func (r *SandboxReconciler) installEgressCA(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, id string) error {
	if r.opts.EgressProxy == nil || !egressInjects(sbx) {
		return nil
	}
	pem := r.opts.EgressProxy.CAPEM()
	if len(pem) == 0 {
		return errors.New("the node's egress proxy has no CA, so it cannot inject into HTTPS")
	}
	return r.docker.InstallEgressCA(ctx, id, pem)
}

// applyEgress hands the policy of a running container to the proxy and
// records the outcome in the EgressPolicyApplied condition. It fails
// closed: a rule whose credential cannot be read is left out (its host is
// refused) rather than allowed without the header, and a policy the proxy
// refuses is replaced by the empty one (nothing is reachable). It returns
// how soon to look again (0: no need).
func (r *SandboxReconciler) applyEgress(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) time.Duration {
	pol := egressPolicyOf(sbx)
	if pol == nil {
		// Unrestricted or no network: a policy some earlier container at
		// this address had must not apply to this one.
		if ct.EgressAddr.IsValid() && r.opts.EgressProxy != nil {
			if _, prev := r.egress.take(ct.ID, ct.EgressAddr); prev != "" {
				r.opts.EgressProxy.RemovePolicy(ct.EgressAddr)
			}
			r.egress.forget(ct.ID)
		}
		meta.RemoveStatusCondition(&sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionEgressPolicyApplied))
		return 0
	}
	set := func(status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{
			Type: string(sandboxv1alpha1.SandboxConditionEgressPolicyApplied), Status: status,
			Reason: reason, Message: truncateMessage(msg), ObservedGeneration: sbx.Generation,
		})
	}
	if r.opts.EgressProxy == nil {
		set(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonEgressProxyUnavailable, "this node runs no egress proxy")
		return 0
	}
	if !ct.EgressAddr.IsValid() {
		set(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonEgressProxyUnavailable,
			"the container has no address on the egress network yet")
		return time.Second
	}
	out, problems := r.buildEgressPolicy(ctx, sbx, pol)
	reason := sandboxv1alpha1.SandboxReasonEgressPolicyApplied
	if len(problems) > 0 {
		reason = problems[0].reason
	}
	if prevAddr, _ := r.egress.take(ct.ID, ct.EgressAddr); prevAddr.IsValid() {
		r.opts.EgressProxy.RemovePolicy(prevAddr)
	}
	if err := r.opts.EgressProxy.SetPolicy(ct.EgressAddr, out); err != nil {
		// Fail closed: nothing rather than something unchecked. The
		// error names rules and hosts, never a value.
		_ = r.opts.EgressProxy.SetPolicy(ct.EgressAddr, egressproxy.Policy{Sandbox: out.Sandbox})
		set(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonEgressPolicyInvalid,
			"the egress proxy refused the policy, so the sandbox reaches nothing: "+err.Error())
		return 0
	}
	if len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = p.message
		}
		set(metav1.ConditionFalse, reason, strings.Join(msgs, "; ")+"; those hosts are refused until this is fixed")
		return r.opts.RetryBackoffBase * 10
	}
	set(metav1.ConditionTrue, reason, fmt.Sprintf("%d hosts allowed", len(out.Rules)))
	for _, rule := range out.Rules {
		if rule.Inject != nil {
			return egressSecretRecheck
		}
	}
	return 0
}

type egressProblem struct{ reason, message string }

// buildEgressPolicy converts the API's policy to the proxy's, reading each
// injected credential from a Secret in the Sandbox's own namespace (never
// another: SecretRef has no namespace). Rules whose Secret cannot be used
// are left out, and each is reported.
func (r *SandboxReconciler) buildEgressPolicy(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, pol *sandboxv1alpha1.EgressPolicy) (egressproxy.Policy, []egressProblem) {
	out := egressproxy.Policy{Sandbox: sbx.Namespace + "/" + sbx.Name}
	var problems []egressProblem
	for _, rule := range pol.Allow {
		pr := egressproxy.Rule{Host: rule.Host}
		for _, p := range rule.Ports {
			pr.Ports = append(pr.Ports, uint16(p)) //nolint:gosec // the CRD bounds ports to 1..65535
		}
		if in := rule.Inject; in != nil {
			value, prob := r.egressSecret(ctx, sbx.Namespace, rule.Host, in)
			if prob != nil {
				problems = append(problems, *prob)
				continue
			}
			pr.Inject = &egressproxy.Injection{Header: in.Header, Value: value}
			if h := rule.HTTP; h != nil {
				for _, m := range h.Methods {
					pr.Inject.Methods = append(pr.Inject.Methods, string(m))
				}
				pr.Inject.PathPrefixes = append(pr.Inject.PathPrefixes, h.PathPrefixes...)
			}
		}
		out.Rules = append(out.Rules, pr)
	}
	return out, problems
}

// egressSecret reads one credential: a direct get (no cache, no watch, no
// list), in namespace only, of a Secret that carries
// sandboxv1alpha1.LabelEgressCredential. The value is returned to go to the
// proxy in memory; it is never logged, never in a condition or Event.
func (r *SandboxReconciler) egressSecret(ctx context.Context, namespace, host string, in *sandboxv1alpha1.EgressInjection) ([]byte, *egressProblem) {
	ref := in.SecretRef
	prob := func(reason, format string, args ...any) *egressProblem {
		return &egressProblem{reason: reason, message: fmt.Sprintf("host %q: ", host) + fmt.Sprintf(format, args...)}
	}
	sec := &corev1.Secret{}
	err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, sec)
	switch {
	case apierrors.IsNotFound(err):
		return nil, prob(sandboxv1alpha1.SandboxReasonSecretNotFound, "Secret %q does not exist in namespace %s", ref.Name, namespace)
	case apierrors.IsForbidden(err):
		return nil, prob(sandboxv1alpha1.SandboxReasonSecretForbidden,
			"the node managers may not read Secret %q in namespace %s: bind the ClusterRole code-sandbox-egress-credentials-role to the node managers there (docs/egress.md)", ref.Name, namespace)
	case err != nil:
		return nil, prob(sandboxv1alpha1.SandboxReasonSecretNotFound, "reading Secret %q: %v", ref.Name, err)
	}
	if sec.Labels[sandboxv1alpha1.LabelEgressCredential] != "true" {
		return nil, prob(sandboxv1alpha1.SandboxReasonSecretForbidden, "Secret %q lacks the label %s=true that marks it for egress injection",
			ref.Name, sandboxv1alpha1.LabelEgressCredential)
	}
	v, ok := sec.Data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, prob(sandboxv1alpha1.SandboxReasonSecretNotFound, "Secret %q has no key %q (or it is empty)", ref.Name, ref.Key)
	}
	value := make([]byte, 0, len(in.ValuePrefix)+len(v))
	value = append(append(value, in.ValuePrefix...), v...)
	return value, nil
}
