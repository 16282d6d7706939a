/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

// EventReasonEgressRefused is the reason of the Warning Event a Sandbox
// gets when the node's egress proxy refuses one of its connections,
// requests or DNS names (docs/egress.md).
const EventReasonEgressRefused = "EgressRefused"

// egressEventEvery is how often one Sandbox gets an Event for the same
// refusal (reason and host): a sandbox retrying in a loop must not flood
// the API server (which also folds repeats of one reason into a series).
// `kubectl sandbox logs --egress` has every decision.
const egressEventEvery = 30 * time.Second

// egressEventKeys bounds the rate limiter's memory.
const egressEventKeys = 4096

// egressEventLimiter lets through one Event per key per egressEventEvery.
type egressEventLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *egressEventLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	if t, ok := l.last[key]; ok && now.Sub(t) < egressEventEvery {
		return false
	}
	if len(l.last) >= egressEventKeys {
		for k, t := range l.last {
			if now.Sub(t) >= egressEventEvery {
				delete(l.last, k)
			}
		}
		if len(l.last) >= egressEventKeys {
			return false // all recent: drop rather than grow
		}
	}
	l.last[key] = now
	return true
}

// EgressAudit is the node egress proxy's audit sink (egressproxy.Config.
// Audit, already rate-limited there): a refusal becomes a Warning Event on
// the Sandbox, at most one per reason and host per egressEventEvery. The
// Event names the decision, host, port, method and path (quoted: the
// sandbox chose them), never a credential: egressproxy.Event has none.
// Events of sources without a policy (no Sandbox) are not recorded.
func (r *SandboxReconciler) EgressAudit(ev egressproxy.Event) {
	if ev.Decision != egressproxy.DecisionRefused {
		return
	}
	ns, name, ok := strings.Cut(ev.Sandbox, "/")
	if !ok || ns == "" || name == "" {
		return
	}
	if !r.egressEvents.allow(ev.Sandbox+"\x00"+ev.Reason+"\x00"+ev.Host, r.clock.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sbx := &sandboxv1alpha1.Sandbox{}
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sbx); err != nil {
		return
	}
	target := strconv.Quote(ev.Host) + ":" + strconv.Itoa(int(ev.Port))
	if ev.Method != "" || ev.Path != "" {
		target += " " + strconv.Quote(ev.Method) + " " + strconv.Quote(ev.Path)
	}
	// The action is the proxy's reason: the events API folds Events of
	// one object, reason and action into one series (with a count), so
	// each kind of refusal keeps an Event of its own.
	r.recorder.Eventf(sbx, nil, "Warning", EventReasonEgressRefused, ev.Reason,
		"the node's egress proxy refused %s: %s (further refusals of this host for this reason are not recorded as Events for %s; kubectl sandbox logs --egress has them all)",
		truncateMessage(target), ev.Reason, egressEventEvery)
}
