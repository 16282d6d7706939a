/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// BenchmarkSustainedWarmClaims claims from a warm pool through the API
// server at a target rate for a duration (issue 26: 45 claims/s for 60 s
// with p99 <= 100 ms), open loop: a claim is sent every 1/rate whether or
// not the earlier ones are Ready. Each claim is a Sandbox with
// spec.warmPoolRef, timed from Create to a watched Ready=True. The
// benchmark plays the pool controller: it fills the pool to a depth before
// the run (untimed) and, during the run, deletes claimed members and adds
// new ones to keep that depth, reporting how many it could bring to idle.
// A claim that finds no idle member is created cold (WarmPoolClaim unset)
// and is counted as a miss, with its own latency. Skipped unless
// CODE_SANDBOX_BENCH_CLAIMS (claims/s) is set; CODE_SANDBOX_BENCH_CLAIMS_SECONDS
// (default 60) and CODE_SANDBOX_BENCH_CLAIMS_DEPTH (default rate*seconds,
// at most 200) size the run; CODE_SANDBOX_BENCH_CLAIMS_REFILL=0 leaves
// the pool unrefilled, to time the claims alone. The bench manager runs
// CODE_SANDBOX_BENCH_WORKERS reconcile workers (default 4) and at most 100
// Sandboxes: members and cold claims past that wait as NodeAtCapacity
// (a warm claim needs no capacity).
func BenchmarkSustainedWarmClaims(b *testing.B) {
	rate := envInt(b, "CODE_SANDBOX_BENCH_CLAIMS")
	if rate <= 0 {
		b.Skip("set CODE_SANDBOX_BENCH_CLAIMS=45 (claims/s; minutes) to run the sustained warm claims benchmark")
	}
	// The testing package runs a benchmark with b.N = 1 before the
	// -benchtime run; the minutes-long run happens once, and every call
	// reports it.
	if sustainedReport == nil {
		sustainedReport = runSustainedClaims(b, rate)
	}
	for _, l := range sustainedReport.lines {
		b.Log(l)
	}
	for unit, v := range sustainedReport.metrics {
		b.ReportMetric(v, unit)
	}
}

// sustainedReport is BenchmarkSustainedWarmClaims's one run.
var sustainedReport *benchReport

type benchReport struct {
	lines   []string
	metrics map[string]float64
}

func runSustainedClaims(b *testing.B, rate int) *benchReport {
	rep := &benchReport{metrics: map[string]float64{}}
	logf := func(format string, args ...any) { rep.lines = append(rep.lines, fmt.Sprintf(format, args...)) }
	seconds := cmp.Or(envInt(b, "CODE_SANDBOX_BENCH_CLAIMS_SECONDS"), 60)
	depth := cmp.Or(envInt(b, "CODE_SANDBOX_BENCH_CLAIMS_DEPTH"), min(rate*seconds, 200))
	e := env(b)
	ctx := context.Background()
	b.StopTimer()
	pool := e.createPool(ctx, b, "bench-sustained-"+runID)
	fillStart := time.Now()
	members, err := e.addIdleMembers(ctx, pool, depth, time.Duration(depth)*5*time.Second+time.Minute)
	b.Cleanup(func() { e.deleteMembers(context.WithoutCancel(ctx), pool) })
	if err != nil {
		b.Fatalf("filling the pool: %v", err)
	}
	fill := time.Since(fillStart)
	logf("pool filled: %d idle members in %s (%.2f members/s, untimed)", len(members), fill.Round(time.Millisecond), float64(depth)/fill.Seconds())

	// Refill: keep depth members that are idle or on their way.
	runCtx, stopRefill := context.WithCancel(ctx)
	var refilled, minIdle atomic.Int64
	minIdle.Store(int64(depth))
	refillDone := make(chan struct{})
	refillOn := os.Getenv("CODE_SANDBOX_BENCH_CLAIMS_REFILL") != "0"
	go func() {
		defer close(refillDone)
		if refillOn {
			e.refill(runCtx, pool, depth, &refilled, &minIdle)
		}
	}()

	type claimResult struct {
		d    time.Duration
		warm bool
		err  error
	}
	var (
		mu      sync.Mutex
		results []claimResult
		wg      sync.WaitGroup
	)
	interval := time.Second / time.Duration(rate)
	total := rate * seconds
	before := managerTimings()
	b.ResetTimer()
	start := time.Now()
	for i := range total {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := fmt.Sprintf("bench-sc-%s-%d", runID, i)
			d, warm, err := e.claimOnce(ctx, name, pool.Name)
			mu.Lock()
			results = append(results, claimResult{d, warm, err})
			mu.Unlock()
		}(i)
	}
	sent := time.Since(start)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	stopRefill()
	<-refillDone

	var warm, cold []time.Duration
	failed := 0
	for _, r := range results {
		switch {
		case r.err != nil:
			failed++
			if failed <= 3 {
				logf("claim failed: %v", r.err)
			}
		case r.warm:
			warm = append(warm, r.d)
		default:
			cold = append(cold, r.d)
		}
	}
	all := append(append([]time.Duration{}, warm...), cold...)
	load, _ := os.ReadFile("/proc/loadavg")
	rep.metrics["claims/s"] = float64(len(all)) / elapsed.Seconds()
	rep.metrics["p50-ms"] = ms(percentile(all, 50))
	rep.metrics["p99-ms"] = ms(percentile(all, 99))
	logf("sustained warm claims: target %d/s for %ds (%d sent in %s), %d Ready in %s: %.1f claims/s achieved",
		rate, seconds, total, sent.Round(time.Millisecond), len(all), elapsed.Round(time.Millisecond), float64(len(all))/elapsed.Seconds())
	logf("  all: p50 %.1fms p99 %.1fms max %.1fms; warm %d (p50 %.1fms p99 %.1fms); cold (pool empty) %d (p50 %.1fms p99 %.1fms); failed %d",
		ms(percentile(all, 50)), ms(percentile(all, 99)), ms(percentile(all, 100)),
		len(warm), ms(percentile(warm, 50)), ms(percentile(warm, 99)), len(cold), ms(percentile(cold, 50)), ms(percentile(cold, 99)), failed)
	after := managerTimings()
	logf("  manager: %d reconcile workers (CODE_SANDBOX_BENCH_WORKERS), at most 100 Sandboxes", cmp.Or(benchWorkers(), 4))
	logf("  in the manager over the run (means, from its metrics): sandbox queue wait %.1fms over %d adds, reconcile %.1fms over %d reconciles, warm claim incl. thaw %.1fms over %d claims",
		after.mean("queue", before), after.count("queue", before), after.mean("reconcile", before), after.count("reconcile", before),
		after.mean("claim", before), after.count("claim", before))
	if !refillOn {
		logf("  refill: off (CODE_SANDBOX_BENCH_CLAIMS_REFILL=0): the claims alone, from the filled pool")
	}
	logf("  refill: %d members brought to idle during the run (%.2f/s), lowest idle depth %d of %d; goal 45/s for 60 s with p99 <= 100ms; load average %s",
		refilled.Load(), float64(refilled.Load())/elapsed.Seconds(), minIdle.Load(), depth, string(load[:len(load)-1]))
	// The claimants go before the members they took.
	for i := range total {
		_ = e.k8s.Delete(context.WithoutCancel(ctx), &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("bench-sc-%s-%d", runID, i)}})
	}
	return rep
}

// claimOnce creates a Sandbox claiming from pool and waits, on a watch,
// until it is Ready; warm says whether it took an idle member.
func (e *benchEnv) claimOnce(ctx context.Context, name, pool string) (time.Duration, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	w, err := e.k8s.Watch(ctx, &sandboxv1alpha1.SandboxList{}, &client.ListOptions{
		Namespace:     namespace,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name),
		Raw:           &metav1.ListOptions{ResourceVersion: "0"},
	})
	if err != nil {
		return 0, false, err
	}
	defer w.Stop()
	t0 := time.Now()
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: pool}},
	}
	if err := e.k8s.Create(ctx, sbx); err != nil {
		return 0, false, err
	}
	for {
		select {
		case <-ctx.Done():
			return 0, false, fmt.Errorf("sandbox %s not Ready after %s", name, readyTimeout)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return 0, false, fmt.Errorf("watch of %s closed", name)
			}
			got, isSbx := ev.Object.(*sandboxv1alpha1.Sandbox)
			if !isSbx || ev.Type == watch.Deleted {
				continue
			}
			if meta.IsStatusConditionTrue(got.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
				return time.Since(t0), meta.IsStatusConditionTrue(got.Status.Conditions, string(sandboxv1alpha1.SandboxConditionWarmPoolClaim)), nil
			}
		}
	}
}

// refill plays the pool controller while ctx lasts: it deletes claimed
// members and creates new ones so that depth members are idle or being
// provisioned. It counts the members that turned idle, and the lowest
// number of idle members it saw.
func (e *benchEnv) refill(ctx context.Context, pool *sandboxv1alpha1.SandboxWarmPool, depth int, refilled, minIdle *atomic.Int64) {
	wasIdle := map[string]bool{}
	for ctx.Err() == nil {
		var list sandboxv1alpha1.SandboxList
		if err := e.k8s.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: pool.Name}); err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		live, idle := 0, 0
		for i := range list.Items {
			m := &list.Items[i]
			if !m.DeletionTimestamp.IsZero() {
				continue
			}
			ready := meta.FindStatusCondition(m.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
			if ready != nil && ready.Reason == sandboxv1alpha1.SandboxReasonClaimed {
				_ = e.k8s.Delete(ctx, m)
				continue
			}
			live++
			if warmpool.Idle(m) {
				idle++
				if _, seen := wasIdle[m.Name]; !seen {
					wasIdle[m.Name] = true
					if len(wasIdle) > depth { // the first depth are the fill
						refilled.Add(1)
					}
				}
			}
		}
		if int64(idle) < minIdle.Load() {
			minIdle.Store(int64(idle))
		}
		for range depth - live {
			if err := e.k8s.Create(ctx, warmpool.Member(pool)); err != nil {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deleteMembers deletes every member of pool and waits (bounded) until
// they are gone, so that their containers go with them.
func (e *benchEnv) deleteMembers(ctx context.Context, pool *sandboxv1alpha1.SandboxWarmPool) {
	_ = e.k8s.DeleteAllOf(ctx, &sandboxv1alpha1.Sandbox{}, client.InNamespace(namespace), client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: pool.Name})
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		var list sandboxv1alpha1.SandboxList
		if err := e.k8s.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: pool.Name}); err != nil || len(list.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// timings are sums (seconds) and counts of the manager's histograms the
// claim path goes through, read from controller-runtime's registry (the
// manager runs in this process): the Sandbox controller's work queue wait
// and reconcile time, and the warm claim (status write and thaw).
type timings map[string][2]float64

func managerTimings() timings {
	t := timings{}
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return t
	}
	for _, f := range families {
		var key string
		switch f.GetName() {
		case "workqueue_queue_duration_seconds":
			key = "queue"
		case "controller_runtime_reconcile_time_seconds":
			key = "reconcile"
		case "code_sandbox_warm_claim_seconds":
			key = "claim"
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			if key != "claim" && !hasLabel(m.GetLabel(), "sandbox") {
				continue
			}
			h := m.GetHistogram()
			v := t[key]
			t[key] = [2]float64{v[0] + h.GetSampleSum(), v[1] + float64(h.GetSampleCount())}
		}
	}
	return t
}

// hasLabel says whether a series is the Sandbox controller's (its name or
// controller label is "sandbox").
func hasLabel(labels []*dto.LabelPair, value string) bool {
	for _, l := range labels {
		if (l.GetName() == "name" || l.GetName() == "controller") && l.GetValue() == value {
			return true
		}
	}
	return false
}

func (t timings) count(key string, since timings) int { return int(t[key][1] - since[key][1]) }

func (t timings) mean(key string, since timings) float64 {
	n := t[key][1] - since[key][1]
	if n <= 0 {
		return 0
	}
	return (t[key][0] - since[key][0]) / n * 1000
}

// benchWorkers is CODE_SANDBOX_BENCH_WORKERS, or 0 (the reconciler's
// default) when unset or not a positive integer.
func benchWorkers() int {
	n, err := strconv.Atoi(os.Getenv("CODE_SANDBOX_BENCH_WORKERS"))
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
