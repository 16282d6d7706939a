/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

const (
	// burstTimeout bounds one whole burst, from the first create to the
	// last Ready (and the setup and cleanup steps around it).
	burstTimeout = 2 * readyTimeout
	// burstPoolSize is P, the idle members added before each warm burst;
	// the burst itself is 2P claimants.
	burstPoolSize = 5
	// coldBurstSize is how many Sandboxes (and raw containers) one cold
	// burst creates at once.
	coldBurstSize = 20
	// burstRawSamples is how many sequential raw Docker create+start
	// samples give the warm burst its reference.
	burstRawSamples = 5
	// coldBurstGoal is the throughput goal of a cold burst: raw Docker's
	// wall time / the operator's. Reported, never asserted.
	coldBurstGoal = 0.9
)

// burstSample is one Sandbox of a burst.
type burstSample struct {
	name    string
	start   time.Time // just before its Create
	created time.Time // Create returned
	ready   time.Time // Ready=True seen by the benchmark's watch
	// sbx is the Sandbox as the watch delivered it with Ready=True.
	sbx *sandboxv1alpha1.Sandbox
}

func (s *burstSample) createToReady() time.Duration { return s.ready.Sub(s.start) }

// parallel runs f(0..n-1) in goroutines and joins their errors.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// createBurst creates one Sandbox per name at once, each from its own
// goroutine, with spec, and waits through one watch of the namespace until
// every one's Ready condition is True. The watch starts at the resourceVersion
// of a list taken just before, so it sees every change to the new Sandboxes
// and nothing older. The benchmark timer runs from just before the first
// Create until the last Ready is seen; the result is that wall time.
func (e *benchEnv) createBurst(ctx context.Context, b *testing.B, names []string, spec sandboxv1alpha1.SandboxSpec) ([]*burstSample, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, burstTimeout)
	defer cancel()
	var list sandboxv1alpha1.SandboxList
	if err := e.k8s.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, 0, fmt.Errorf("listing sandboxes: %w", err)
	}
	w, err := e.k8s.Watch(ctx, &sandboxv1alpha1.SandboxList{}, &client.ListOptions{
		Namespace: namespace,
		Raw:       &metav1.ListOptions{ResourceVersion: list.ResourceVersion},
	})
	if err != nil {
		return nil, 0, fmt.Errorf("watching sandboxes: %w", err)
	}
	defer w.Stop()

	samples := make([]*burstSample, len(names))
	index := make(map[string]int, len(names))
	for i, name := range names {
		samples[i] = &burstSample{name: name}
		index[name] = i
	}
	// The creators write start and created; the watch loop below writes
	// ready and sbx. The WaitGroup orders the former before the caller reads.
	release := make(chan struct{})
	createErrs := make(chan error, len(names))
	var creators sync.WaitGroup
	for i := range names {
		creators.Add(1)
		go func() {
			defer creators.Done()
			<-release
			s := samples[i]
			sbx := &sandboxv1alpha1.Sandbox{
				ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: s.name},
				Spec:       *spec.DeepCopy(),
			}
			s.start = time.Now()
			err := e.k8s.Create(ctx, sbx)
			s.created = time.Now()
			if err != nil {
				createErrs <- fmt.Errorf("creating sandbox %s: %w", s.name, err)
			}
		}()
	}
	fail := func(err error) ([]*burstSample, time.Duration, error) {
		b.StopTimer()
		cancel()
		creators.Wait()
		return samples, 0, err
	}

	b.StartTimer()
	t0 := time.Now()
	close(release)
	last := make(map[string]string, len(names))
	var lastReady time.Time
	for pending := len(names); pending > 0; {
		select {
		case <-ctx.Done():
			var waiting []string
			for _, s := range samples {
				if s.ready.IsZero() {
					waiting = append(waiting, fmt.Sprintf("%s (Ready %s)", s.name, last[s.name]))
				}
			}
			return fail(fmt.Errorf("%d of %d sandboxes not Ready after %s: %v", pending, len(names), burstTimeout, waiting))
		case err := <-createErrs:
			return fail(err)
		case ev, ok := <-w.ResultChan():
			now := time.Now()
			if !ok {
				return fail(errors.New("watch of the burst's sandboxes closed early"))
			}
			switch ev.Type {
			case watch.Error:
				return fail(fmt.Errorf("watching the burst's sandboxes: %w", apierrors.FromObject(ev.Object)))
			case watch.Bookmark:
				continue
			}
			got, ok := ev.Object.(*sandboxv1alpha1.Sandbox)
			if !ok {
				continue
			}
			i, mine := index[got.Name]
			if !mine || !samples[i].ready.IsZero() {
				continue
			}
			if ev.Type == watch.Deleted {
				return fail(fmt.Errorf("sandbox %s was deleted while waiting for Ready", got.Name))
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
			if cond == nil {
				continue
			}
			last[got.Name] = fmt.Sprintf("%s/%s: %s", cond.Status, cond.Reason, cond.Message)
			switch {
			case cond.Status == metav1.ConditionTrue:
				samples[i].ready, samples[i].sbx = now, got
				lastReady = now
				pending--
			case failedReasons[cond.Reason]:
				return fail(fmt.Errorf("sandbox %s failed: Ready %s", got.Name, last[got.Name]))
			}
		}
	}
	b.StopTimer()
	creators.Wait()
	for _, s := range samples {
		if s.sbx.Status.ContainerID == "" {
			return samples, 0, fmt.Errorf("sandbox %s is Ready without a container ID", s.name)
		}
	}
	return samples, lastReady.Sub(t0), nil
}

// deleteBurst deletes a burst's Sandboxes in parallel and waits until they
// and their containers are gone. Not timed.
func (e *benchEnv) deleteBurst(ctx context.Context, samples []*burstSample) error {
	return parallel(len(samples), func(i int) error {
		id := ""
		if samples[i].sbx != nil {
			id = samples[i].sbx.Status.ContainerID
		}
		return e.deleteSandbox(ctx, samples[i].name, id)
	})
}

func burstNames(tag string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%s-%s-%d", runID, tag, seq.Add(1))
	}
	return names
}

// BenchmarkWarmPoolBurst measures claims arriving in a burst: per iteration
// the benchmark adds P idle members to a SandboxWarmPool (untimed), then
// creates 2P claimants at once and times each one's create-to-Ready. Some
// claims are warm (an idle member's container), the rest cold (a container
// made from the template); the warm share and the claims' p50 and p99 are
// reported, with a raw Docker create+start p50 from the same run as the
// reference. ns/op is a burst's wall time, first create to last Ready.
// Without a pool controller the benchmark plays it: it adds the members and
// deletes the claimed ones.
func BenchmarkWarmPoolBurst(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()

	pool := e.createPool(ctx, b, "bench-burst-pool-"+runID)
	addIdleMembers := func(n int) ([]*sandboxv1alpha1.Sandbox, error) {
		return e.addIdleMembers(ctx, pool, n, burstTimeout)
	}
	runRaw := func(tag string) rawSample { return e.rawSampleOnce(ctx, b, tag) }

	// Warm up: the first Sandbox fills the tools volume both paths mount.
	warm := burstNames("warmup", 1)
	ws, _, err := e.createBurst(ctx, b, warm, sandboxv1alpha1.SandboxSpec{Image: e.image})
	if err = errors.Join(err, e.deleteBurst(ctx, ws)); err != nil {
		b.Fatal(err)
	}
	runRaw("warmup")
	raws := make([]rawSample, 0, burstRawSamples)
	for range burstRawSamples {
		raws = append(raws, runRaw("raw"))
	}
	b.ResetTimer()
	b.StopTimer()

	var claims, warmClaims, coldClaims, walls []time.Duration
	for range b.N {
		members, err := addIdleMembers(burstPoolSize)
		if err != nil {
			b.Fatal(err)
		}
		samples, wall, err := e.createBurst(ctx, b, burstNames("claim", 2*burstPoolSize),
			sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: pool.Name}})
		walls = append(walls, wall)

		// Untimed: classify the claims, then clean up as the pool
		// controller would (claimed members go first), then the
		// claimants, then members nobody claimed.
		claimed := map[string]bool{}
		for _, s := range samples {
			if err != nil || s.sbx == nil {
				break
			}
			d := s.createToReady()
			claims = append(claims, d)
			c := meta.FindStatusCondition(s.sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionWarmPoolClaim))
			switch {
			case c == nil:
				err = fmt.Errorf("claim %s is Ready without a WarmPoolClaim condition", s.name)
			case c.Status == metav1.ConditionTrue:
				warmClaims = append(warmClaims, d)
				if wp := s.sbx.Status.WarmPool; wp == nil || wp.Member == nil || wp.Member.Name == "" {
					err = fmt.Errorf("warm claim %s records no member", s.name)
				} else {
					claimed[wp.Member.Name] = true
				}
			default:
				coldClaims = append(coldClaims, d)
			}
		}
		var claimedMembers, idleMembers []*burstSample
		for _, m := range members {
			if claimed[m.Name] {
				// Its container is the claimant's now.
				claimedMembers = append(claimedMembers, &burstSample{name: m.Name})
			} else {
				idleMembers = append(idleMembers, &burstSample{name: m.Name, sbx: m})
			}
		}
		err = errors.Join(err, e.deleteBurst(ctx, claimedMembers))
		err = errors.Join(err, e.deleteBurst(ctx, samples))
		err = errors.Join(err, e.deleteBurst(ctx, idleMembers))
		if err != nil {
			b.Fatal(err)
		}
	}

	share := float64(len(warmClaims)) / float64(len(claims))
	p50, p99 := percentile(claims, 50), percentile(claims, 99)
	rawP50 := percentile(collect(raws, func(s rawSample) time.Duration { return s.running }), 50)
	b.ReportMetric(share, "warm-share")
	b.ReportMetric(ms(p50), "claim-p50-ms")
	b.ReportMetric(ms(p99), "claim-p99-ms")
	b.ReportMetric(ms(rawP50), "raw-p50-ms")
	b.Logf("burst of %d claims on %d idle members: warm share %.2f (%d warm, %d cold); claim create-to-Ready p50 %.0fms, p99 %.0fms vs raw Docker create+start p50 %.0fms [n=%d bursts, %d claims]",
		2*burstPoolSize, burstPoolSize, share, len(warmClaims), len(coldClaims), ms(p50), ms(p99), ms(rawP50), b.N, len(claims))
	b.Logf("p50 by kind: warm %.0fms, cold %.0fms; burst wall time (first create to last Ready) p50 %.0fms",
		ms(percentile(warmClaims, 50)), ms(percentile(coldClaims, 50)), ms(percentile(walls, 50)))
}

// BenchmarkColdBurst compares, per iteration and in alternating order, (a)
// creating 20 default Sandboxes at once through the API server until all
// are Ready, against (b) raw Docker creating and starting 20 of the same
// hardened containers in parallel until all run. ns/op is the operator's
// wall time; the custom metrics hold both wall times' p50 and the
// throughput ratio raw/operator (goal >= 0.9, reported, never asserted).
func BenchmarkColdBurst(b *testing.B) {
	e := env(b)
	ctx := context.Background()
	b.StopTimer()

	runOp := func(tag string, n int) time.Duration {
		samples, wall, err := e.createBurst(ctx, b, burstNames(tag, n), sandboxv1alpha1.SandboxSpec{Image: e.image})
		if derr := e.deleteBurst(ctx, samples); derr != nil {
			err = errors.Join(err, derr)
		}
		if err != nil {
			b.Fatal(err)
		}
		return wall
	}
	runRaw := func(tag string, n int) time.Duration {
		ids := make([]string, n)
		done := make([]time.Time, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, ids[i], errs[i] = e.rawCreateToRunning(ctx, fmt.Sprintf("%s-%d", tag, seq.Add(1)))
				done[i] = time.Now()
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		lastDone := latest(done)
		err := errors.Join(errs...)
		err = errors.Join(err, parallel(n, func(i int) error { return e.removeRaw(ctx, ids[i]) }))
		if err != nil {
			b.Fatal(err)
		}
		return lastDone.Sub(t0)
	}

	// Warm up: the tools volume, connections and caches; a small burst.
	runOp("warmup", 2)
	runRaw("warmup", 2)
	b.ResetTimer()
	b.StopTimer()

	var ops, raws []time.Duration
	for i := range b.N {
		// Alternate which path goes first so that drifting machine noise
		// lands on both evenly.
		if i%2 == 0 {
			ops = append(ops, runOp("cold", coldBurstSize))
			raws = append(raws, runRaw("raw", coldBurstSize))
		} else {
			raws = append(raws, runRaw("raw", coldBurstSize))
			ops = append(ops, runOp("cold", coldBurstSize))
		}
	}

	opP50, rawP50 := percentile(ops, 50), percentile(raws, 50)
	ratio := float64(rawP50) / float64(opP50)
	perSec := func(d time.Duration) float64 { return float64(coldBurstSize) / d.Seconds() }
	b.ReportMetric(ms(opP50), "op-wall-p50-ms")
	b.ReportMetric(ms(rawP50), "raw-wall-p50-ms")
	b.ReportMetric(perSec(opP50), "op-sandboxes/s")
	b.ReportMetric(ratio, "throughput-ratio")
	verdict := "meets"
	if ratio < coldBurstGoal {
		verdict = "MISSES"
	}
	b.Logf("burst of %d: operator all Ready in %.0fms (p50) vs raw Docker all running in %.0fms: throughput ratio raw/op %.3f (goal >= %.1f; %s it) [n=%d; %.1f vs %.1f sandboxes/s]",
		coldBurstSize, ms(opP50), ms(rawP50), ratio, coldBurstGoal, verdict, b.N, perSec(opP50), perSec(rawP50))
	b.Logf("per-burst wall times in ms (operator | raw): %s | %s", msList(ops), msList(raws))
}

// latest is the latest of ts (the zero time for none).
func latest(ts []time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}
