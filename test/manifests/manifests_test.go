/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
)

// What config/default installs, and where.
const (
	installNamespace = "code-sandbox-system"
	managerImage     = "code-sandbox-operator/manager:latest"
	mcpImage         = "code-sandbox-operator/mcp-server:latest"
	engineImage      = "code-sandbox-operator/engine:latest"
	// The Engine Pod's socket (config/engine), in the directory the
	// manager mounts.
	engineSocketDir = "/run/code-sandbox-operator"
	nonRootUID      = int64(65532)
)

var _ = Describe("Every kustomization under config/", func() {
	dirs := kustomizationDirs()

	It("includes the overlays this suite knows about", func() {
		Expect(dirs).To(ContainElements(
			"config/crd", "config/rbac", "config/manager", "config/webhook",
			"config/mcp", "config/policy", "config/default", "config/samples",
			"config/engine", "config/node-docker", "config/kind/deploy"))
	})

	for _, dir := range dirs {
		It("renders and is accepted by the API server: "+dir, func(ctx SpecContext) {
			objs := render(dir)
			Expect(objs).NotTo(BeEmpty(), "%s renders no objects", dir)
			prepare(ctx, objs)
			for _, obj := range objs {
				Expect(applyDryRun(ctx, obj)).To(Succeed(), "%s from %s: server-side apply (dry run) refused", describe(obj), dir)
			}
		})
	}

	// Negative controls: the dry run would be worthless if the API server
	// accepted anything.
	It("refuses what is broken, so the dry runs above prove something", func(ctx SpecContext) {
		objs := render("config/default")
		prepare(ctx, objs)

		dep := find(objs, "Deployment", "code-sandbox-webhook").DeepCopy()
		Expect(unstructured.SetNestedField(dep.Object, "yes", "spec", "template", "spec", "containers0")).To(Succeed())
		Expect(applyDryRun(ctx, dep)).To(MatchError(ContainSubstring("containers0")), "an unknown field must be refused")

		vwc := find(objs, "ValidatingWebhookConfiguration", "code-sandbox-validating-webhook-configuration").DeepCopy()
		hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
		hook := hooks[1].(map[string]any)
		hook["matchConditions"] = []any{map[string]any{"name": "broken", "expression": "object.spec.activeDeadlineSeconds >"}}
		Expect(unstructured.SetNestedSlice(vwc.Object, hooks, "webhooks")).To(Succeed())
		Expect(applyDryRun(ctx, vwc)).To(MatchError(ContainSubstring("compil")), "a match condition that does not compile must be refused")

		samples := render("config/samples")
		prepare(ctx, samples)
		sbx := find(samples, "Sandbox", "sandbox-sample").DeepCopy()
		Expect(unstructured.SetNestedField(sbx.Object, "1Mi", "spec", "resources", "memory")).To(Succeed())
		Expect(applyDryRun(ctx, sbx)).To(MatchError(ContainSubstring("memory must be at least")), "the Sandbox CRD's CEL rules must run")
	})
})

var _ = Describe("The default overlay (make deploy, make build-installer)", func() {
	var objs []*unstructured.Unstructured

	BeforeEach(func() {
		objs = render("config/default")
	})

	It("installs exactly the expected objects", func() {
		var got []string
		for _, o := range objs {
			got = append(got, o.GetKind()+" "+nsName(o))
		}
		ns := installNamespace + "/"
		Expect(got).To(ConsistOf(
			"Namespace "+installNamespace,
			"CustomResourceDefinition sandboxes.sandbox.code-sandbox.dev",
			"CustomResourceDefinition sandboxquotas.sandbox.code-sandbox.dev",
			"CustomResourceDefinition sandboxwarmpools.sandbox.code-sandbox.dev",
			"CustomResourceDefinition sandboxsnapshots.sandbox.code-sandbox.dev",
			// The manager, one per node.
			"ServiceAccount "+ns+"code-sandbox-controller-manager",
			"ClusterRole code-sandbox-manager-role",
			"ClusterRoleBinding code-sandbox-manager-rolebinding",
			"Role "+ns+"code-sandbox-manager-role",
			"RoleBinding "+ns+"code-sandbox-manager-rolebinding",
			"DaemonSet "+ns+"code-sandbox-controller-manager",
			// The Docker Engine the sandboxes run in, one per node.
			"DaemonSet "+ns+"code-sandbox-engine",
			// HTTPS metrics for authenticated and authorized callers.
			"ClusterRole code-sandbox-metrics-auth-role",
			"ClusterRoleBinding code-sandbox-metrics-auth-rolebinding",
			"ClusterRole code-sandbox-metrics-reader",
			"Service "+ns+"code-sandbox-controller-manager-metrics-service",
			"Service "+ns+"code-sandbox-webhook-metrics-service",
			// User-facing roles.
			"ClusterRole code-sandbox-sandbox-admin-role",
			"ClusterRole code-sandbox-sandbox-editor-role",
			"ClusterRole code-sandbox-sandbox-viewer-role",
			"ClusterRole code-sandbox-sandbox-exec-role",
			"ClusterRole code-sandbox-sandboxquota-editor-role",
			"ClusterRole code-sandbox-sandboxwarmpool-editor-role",
			"ClusterRole code-sandbox-sandboxwarmpool-viewer-role",
			"ClusterRole code-sandbox-sandboxsnapshot-editor-role",
			"ClusterRole code-sandbox-sandboxsnapshot-viewer-role",
			// Egress credentials, bound by namespaces that opt in.
			"ClusterRole code-sandbox-egress-credentials-role",
			// The admission webhook.
			"ServiceAccount "+ns+"code-sandbox-webhook",
			"ClusterRole code-sandbox-webhook-role",
			"ClusterRoleBinding code-sandbox-webhook-rolebinding",
			"Role "+ns+"code-sandbox-webhook-role",
			"RoleBinding "+ns+"code-sandbox-webhook-rolebinding",
			"Deployment "+ns+"code-sandbox-webhook",
			"PodDisruptionBudget "+ns+"code-sandbox-webhook",
			"PodDisruptionBudget "+ns+"code-sandbox-mcp-server",
			"Service "+ns+"code-sandbox-webhook-service",
			"NetworkPolicy "+ns+"code-sandbox-webhook-ingress",
			"ValidatingWebhookConfiguration code-sandbox-validating-webhook-configuration",
			// The aggregated API (exec, files, log, history), served by the
			// webhook's Deployment.
			"APIService v1alpha1.subresources.sandbox.code-sandbox.dev",
			"Service "+ns+"code-sandbox-apiserver",
			"ClusterRole code-sandbox-apiserver-auth-reader",
			"ClusterRoleBinding code-sandbox-apiserver-auth-delegator",
			"ClusterRoleBinding code-sandbox-apiserver-auth-reader",
			// The MCP server.
			"ServiceAccount "+ns+"code-sandbox-mcp-server",
			"ClusterRole code-sandbox-mcp-server-role",
			"ClusterRoleBinding code-sandbox-mcp-server-rolebinding",
			"Deployment "+ns+"code-sandbox-mcp-server",
			"Service "+ns+"code-sandbox-mcp-server",
			// Only the node managers write Sandbox status (config/policy).
			"ValidatingAdmissionPolicy code-sandbox-sandbox-status-writers",
			"ValidatingAdmissionPolicyBinding code-sandbox-sandbox-status-writers",
			// and SandboxSnapshot status, each its own node's.
			"ValidatingAdmissionPolicy code-sandbox-snapshot-status-writers",
			"ValidatingAdmissionPolicyBinding code-sandbox-snapshot-status-writers",
			// and change only the finalizers of their own node's Sandboxes.
			"ValidatingAdmissionPolicy code-sandbox-sandbox-manager-updates",
			"ValidatingAdmissionPolicyBinding code-sandbox-sandbox-manager-updates",
			// and write only their own node's Lease.
			"ValidatingAdmissionPolicy code-sandbox-node-manager-leases",
			"ValidatingAdmissionPolicyBinding code-sandbox-node-manager-leases",
			// Only the warm pool controller creates warm pool members.
			"ValidatingAdmissionPolicy code-sandbox-sandbox-warm-pool-members",
			"ValidatingAdmissionPolicyBinding code-sandbox-sandbox-warm-pool-members",
			// Only the MCP server sets the MCP ownership label.
			"ValidatingAdmissionPolicy code-sandbox-mcp-owner-labels",
			"ValidatingAdmissionPolicyBinding code-sandbox-mcp-owner-labels",
			// and writes its --max-sandboxes reservation Leases.
			"ValidatingAdmissionPolicy code-sandbox-mcp-reservations",
			"ValidatingAdmissionPolicyBinding code-sandbox-mcp-reservations",
			// The control plane only releases the finalizer of a deleted
			// Sandbox on a lost node.
			"ValidatingAdmissionPolicy code-sandbox-sandbox-control-plane-updates",
			"ValidatingAdmissionPolicyBinding code-sandbox-sandbox-control-plane-updates",
		))
		for _, o := range objs {
			Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/part-of", "code-sandbox-operator"), describe(o))
		}
	})

	It("has a webhook configuration that fails closed and leaves finalizers alone", func() {
		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		convert(find(objs, "ValidatingWebhookConfiguration", "code-sandbox-validating-webhook-configuration"), vwc)
		svc := &corev1.Service{}
		convert(find(objs, "Service", "code-sandbox-webhook-service"), svc)

		Expect(vwc.Webhooks).To(HaveLen(7))
		byName := map[string]admissionregistrationv1.ValidatingWebhook{}
		for _, w := range vwc.Webhooks {
			byName[w.Name] = w
			Expect(w.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)), w.Name)
			Expect(w.MatchPolicy).To(HaveValue(Equal(admissionregistrationv1.Equivalent)), w.Name)
			Expect(w.TimeoutSeconds).To(HaveValue(BeEquivalentTo(10)), w.Name)
			Expect(w.AdmissionReviewVersions).To(Equal([]string{"v1"}), w.Name)
			// The webhook injects its own CA at run time.
			Expect(w.ClientConfig.CABundle).To(BeEmpty(), w.Name)
			Expect(w.ClientConfig.URL).To(BeNil(), w.Name)
			Expect(w.ClientConfig.Service).NotTo(BeNil(), w.Name)
			Expect(w.ClientConfig.Service.Name).To(Equal(svc.Name), "%s must call the rendered Service", w.Name)
			Expect(w.ClientConfig.Service.Namespace).To(Equal(svc.Namespace), w.Name)
			Expect(w.ClientConfig.Service.Port).To(HaveValue(BeEquivalentTo(443)), w.Name)
			Expect(svc.Spec.Ports).To(ContainElement(HaveField("Port", BeEquivalentTo(443))))
			Expect(w.Rules).To(HaveLen(1), w.Name)
			Expect(w.Rules[0].APIGroups).To(Equal([]string{"sandbox.code-sandbox.dev"}), w.Name)
			Expect(w.Rules[0].APIVersions).To(Equal([]string{"v1alpha1"}), w.Name)
			Expect(w.Rules[0].Scope).To(HaveValue(Equal(admissionregistrationv1.NamespacedScope)), w.Name)
			// Not sandboxes/status, not "*": status writes and finalizer
			// removal must never wait for the webhook.
			if w.Name == "sandbox-warm-pool.code-sandbox.dev" {
				Expect(w.Rules[0].Resources).To(Equal([]string{"sandboxwarmpools"}), w.Name)
				Expect(w.ClientConfig.Service.Path).To(HaveValue(Equal("/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxwarmpool")), w.Name)
				continue
			}
			if w.Name == "sandbox-snapshot.code-sandbox.dev" {
				// Creates only: status, finalizers and deletion of
				// snapshots never wait for the webhook.
				Expect(w.Rules[0].Resources).To(Equal([]string{"sandboxsnapshots"}), w.Name)
				Expect(w.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}), w.Name)
				Expect(w.SideEffects).To(HaveValue(Equal(admissionregistrationv1.SideEffectClassNone)), w.Name)
				Expect(w.ClientConfig.Service.Path).To(HaveValue(Equal("/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxsnapshot")), w.Name)
				continue
			}
			if w.Name == "sandbox-snapshot-claim.code-sandbox.dev" {
				// Status updates that change status.node only (a claim):
				// the holding manager's other status writes never wait.
				Expect(w.Rules[0].Resources).To(Equal([]string{"sandboxsnapshots/status"}), w.Name)
				Expect(w.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}), w.Name)
				Expect(w.MatchConditions).To(HaveLen(1), w.Name)
				Expect(w.MatchConditions[0].Expression).To(And(ContainSubstring("object.status.node"), ContainSubstring("oldObject.status.node")), w.Name)
				Expect(w.SideEffects).To(HaveValue(Equal(admissionregistrationv1.SideEffectClassNone)), w.Name)
				Expect(w.ClientConfig.Service.Path).To(HaveValue(Equal("/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxsnapshot")), w.Name)
				continue
			}
			Expect(w.Rules[0].Resources).To(Equal([]string{"sandboxes"}), w.Name)
			Expect(w.ClientConfig.Service.Path).To(HaveValue(Equal("/validate-sandbox-code-sandbox-dev-v1alpha1-sandbox")), w.Name)
		}
		// The quota webhook charges admitted Sandboxes in quota status,
		// except on dry runs; the others only read.
		Expect(byName["sandbox-quota.code-sandbox.dev"].SideEffects).To(HaveValue(Equal(admissionregistrationv1.SideEffectClassNoneOnDryRun)))
		Expect(byName).To(HaveKey("sandbox-warm-pool-member.code-sandbox.dev"))
		Expect(byName["sandbox-warm-pool-member.code-sandbox.dev"].Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}))
		Expect(byName).To(HaveKey("sandbox-quota.code-sandbox.dev"))
		Expect(byName["sandbox-quota.code-sandbox.dev"].Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Create}))
		Expect(byName["sandbox-quota.code-sandbox.dev"].MatchConditions).To(BeEmpty())
		Expect(byName).To(HaveKey("sandbox-deadline.code-sandbox.dev"))
		deadline := byName["sandbox-deadline.code-sandbox.dev"]
		Expect(deadline.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}))
		Expect(deadline.MatchConditions).To(HaveLen(1))
		Expect(deadline.MatchConditions[0].Expression).To(ContainSubstring("activeDeadlineSeconds"))
		Expect(deadline.MatchConditions[0].Expression).To(ContainSubstring("oldObject"))
		Expect(byName).To(HaveKey("sandbox-egress.code-sandbox.dev"))
		egress := byName["sandbox-egress.code-sandbox.dev"]
		Expect(egress.Rules[0].Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}))
		Expect(egress.MatchConditions).To(HaveLen(1))
		Expect(egress.MatchConditions[0].Expression).To(ContainSubstring("network.egress"))
	})

	It("locks down every pod as tightly as its job allows", func() {
		workloads := 0
		for _, o := range objs {
			var tmpl *corev1.PodTemplateSpec
			switch o.GetKind() {
			case "Deployment":
				d := &appsv1.Deployment{}
				convert(o, d)
				tmpl = &d.Spec.Template
			case "DaemonSet":
				d := &appsv1.DaemonSet{}
				convert(o, d)
				tmpl = &d.Spec.Template
			case "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet":
				Fail("unexpected workload " + describe(o))
			default:
				continue
			}
			workloads++
			what := describe(o)
			pod := tmpl.Spec
			if o.GetKind() == "DaemonSet" && o.GetName() == "code-sandbox-engine" {
				// Privileged by design (dockerd); checked on its own below.
				continue
			}
			// The manager alone runs in the host's network namespace, with
			// NET_ADMIN and NET_RAW: it keeps the egress firewall there.
			isManager := o.GetKind() == "DaemonSet" && o.GetName() == "code-sandbox-controller-manager"
			Expect(pod.HostNetwork).To(Equal(isManager), what)
			Expect(pod.HostPID).To(BeFalse(), what)
			Expect(pod.HostIPC).To(BeFalse(), what)
			Expect(pod.SecurityContext).NotTo(BeNil(), what)
			Expect(pod.SecurityContext.SeccompProfile).NotTo(BeNil(), what)
			Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault), what)
			Expect(pod.InitContainers).To(BeEmpty(), what)
			for _, c := range pod.Containers {
				what := what + " container " + c.Name
				sc := c.SecurityContext
				Expect(sc).NotTo(BeNil(), what)
				Expect(sc.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()), what)
				Expect(sc.AllowPrivilegeEscalation).To(HaveValue(BeFalse()), what)
				Expect(sc.Privileged).To(Or(BeNil(), HaveValue(BeFalse())), what)
				Expect(sc.Capabilities).NotTo(BeNil(), what)
				Expect(sc.Capabilities.Drop).To(ContainElement(corev1.Capability("ALL")), what)
				if isManager {
					Expect(sc.Capabilities.Add).To(ConsistOf(corev1.Capability("NET_ADMIN"), corev1.Capability("NET_RAW")), what)
				} else {
					Expect(sc.Capabilities.Add).To(BeEmpty(), what)
				}
				Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceCPU), what)
				Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory), what)
				Expect(c.Resources.Limits).To(HaveKey(corev1.ResourceMemory), what)
				Expect(c.LivenessProbe).NotTo(BeNil(), what)
				Expect(c.ReadinessProbe).NotTo(BeNil(), what)
				// Both images were rewritten by the images: entries, and
				// images loaded onto the nodes are used as they are.
				Expect(c.Image).To(BeElementOf(managerImage, mcpImage), what)
				Expect(c.ImagePullPolicy).To(Equal(corev1.PullIfNotPresent), what)
			}
		}
		Expect(workloads).To(Equal(4), "the manager and Engine DaemonSets and the webhook and MCP server Deployments")
	})

	It("runs the webhook and the MCP server as non-root without host access", func() {
		for _, name := range []string{"code-sandbox-webhook", "code-sandbox-mcp-server"} {
			d := &appsv1.Deployment{}
			convert(find(objs, "Deployment", name), d)
			pod := d.Spec.Template.Spec
			Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()), name)
			Expect(pod.SecurityContext.RunAsUser).To(HaveValue(Equal(nonRootUID)), name)
			Expect(pod.SecurityContext.RunAsGroup).To(HaveValue(Equal(nonRootUID)), name)
			for _, c := range pod.Containers {
				Expect(c.SecurityContext.RunAsUser).To(Or(BeNil(), HaveValue(Equal(nonRootUID))), name)
			}
			for _, v := range pod.Volumes {
				Expect(v.HostPath).To(BeNil(), "%s must not mount host paths (volume %s)", name, v.Name)
			}
		}
	})

	It("gives the manager the Engine Pod's socket directory, its node name and the node API port", func() {
		ds := &appsv1.DaemonSet{}
		convert(find(objs, "DaemonSet", "code-sandbox-controller-manager"), ds)
		pod := ds.Spec.Template.Spec
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal(managerImage))
		Expect(c.Env).To(ContainElement(And(
			HaveField("Name", "NODE_NAME"),
			HaveField("ValueFrom.FieldRef.FieldPath", "spec.nodeName"))))
		Expect(c.Args).To(ContainElement("--node-name=$(NODE_NAME)"))
		Expect(c.Ports).To(ContainElement(And(HaveField("Name", "node-api"), HaveField("ContainerPort", BeEquivalentTo(9443)))))
		Expect(c.Args).To(ContainElement("--node-api-bind-address=:9443"))
		// Metrics: HTTPS (--metrics-secure defaults to true) through the
		// metrics Service.
		Expect(c.Args).To(ContainElement("--metrics-bind-address=:8443"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--metrics-secure=false")))
		Expect(c.Ports).To(ContainElement(And(HaveField("Name", "metrics"), HaveField("ContainerPort", BeEquivalentTo(8443)))))
		metricsSvc := &corev1.Service{}
		convert(find(objs, "Service", "code-sandbox-controller-manager-metrics-service"), metricsSvc)
		Expect(metricsSvc.Spec.Ports).To(ConsistOf(And(HaveField("Port", BeEquivalentTo(8443)), HaveField("TargetPort", intstr.FromString("metrics")))))
		Expect(selects(metricsSvc.Spec.Selector, ds.Spec.Template.Labels)).To(BeTrue())
		// The egress firewall: host network, iptables' lock shared with
		// the node.
		Expect(pod.HostNetwork).To(BeTrue())
		Expect(c.VolumeMounts).To(ContainElement(HaveField("MountPath", "/run/xtables.lock")))
		// The directory, so that a socket an Engine restart recreates is
		// seen; no mount of the node's own Docker socket.
		dir := hostPathVolume(pod, engineSocketDir)
		Expect(dir).NotTo(BeNil(), "the Engine socket directory volume")
		Expect(dir.HostPath.Type).To(HaveValue(Equal(corev1.HostPathDirectoryOrCreate)))
		Expect(c.VolumeMounts).To(ContainElement(And(HaveField("Name", dir.Name), HaveField("MountPath", engineSocketDir), HaveField("ReadOnly", BeTrue()))))
		Expect(hostPathVolume(pod, "/var/run/docker.sock")).To(BeNil())
		Expect(c.Args).To(ContainElement("--docker-host=unix://" + engineSocketDir + "/docker.sock"))
	})

	It("runs a Docker Engine on every node of the manager, sharing its network namespace and socket", func() {
		mgr, eng := &appsv1.DaemonSet{}, &appsv1.DaemonSet{}
		convert(find(objs, "DaemonSet", "code-sandbox-controller-manager"), mgr)
		convert(find(objs, "DaemonSet", "code-sandbox-engine"), eng)
		pod := eng.Spec.Template.Spec
		Expect(eng.Spec.Template.Labels).To(HaveKeyWithValue("app.kubernetes.io/component", "engine"))
		// Separate from the manager: a manager rollout never selects it.
		Expect(selects(mgr.Spec.Selector.MatchLabels, eng.Spec.Template.Labels)).To(BeFalse())
		Expect(selects(eng.Spec.Selector.MatchLabels, mgr.Spec.Template.Labels)).To(BeFalse())
		Expect(eng.Spec.UpdateStrategy.Type).To(Equal(appsv1.OnDeleteDaemonSetStrategyType), "an Engine restarts only when its Pod is deleted")
		// Same nodes as the manager.
		Expect(pod.NodeSelector).To(Equal(mgr.Spec.Template.Spec.NodeSelector))
		Expect(pod.Tolerations).To(Equal(mgr.Spec.Template.Spec.Tolerations))
		// The egress bridge in the namespace the manager's firewall is in.
		Expect(pod.HostNetwork).To(BeTrue())
		Expect(pod.HostPID).To(BeTrue(), "the sandboxes must not be in a PID namespace that dies with the Pod")
		Expect(pod.AutomountServiceAccountToken).To(HaveValue(BeFalse()))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Name).To(Equal("dockerd"))
		Expect(c.Image).To(Equal(engineImage))
		Expect(c.ImagePullPolicy).To(Equal(corev1.PullIfNotPresent))
		Expect(c.SecurityContext.Privileged).To(HaveValue(BeTrue()))
		Expect(c.ReadinessProbe).NotTo(BeNil())
		Expect(c.ReadinessProbe.Exec.Command).To(ContainElement("--host=unix://" + engineSocketDir + "/docker.sock"))
		Expect(c.LivenessProbe).To(BeNil(), "a failing liveness probe would restart the Engine")
		Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceCPU))
		Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory))
		Expect(c.Resources.Limits).NotTo(HaveKey(corev1.ResourceMemory), "the Engine's memory grows with the sandboxes")
		sock := hostPathVolume(pod, engineSocketDir)
		Expect(sock).NotTo(BeNil())
		Expect(c.VolumeMounts).To(ContainElement(And(HaveField("Name", sock.Name), HaveField("MountPath", engineSocketDir))))
		for _, path := range []string{"/var/lib/code-sandbox-operator/docker", "/run/code-sandbox-engine"} {
			v := hostPathVolume(pod, path)
			Expect(v).NotTo(BeNil(), path)
			Expect(c.VolumeMounts).To(ContainElement(And(HaveField("Name", v.Name), HaveField("MountPath", path),
				HaveField("MountPropagation", HaveValue(Equal(corev1.MountPropagationBidirectional))))), path)
		}
		Expect(hostPathVolume(pod, "/run/xtables.lock")).NotTo(BeNil(), "iptables' lock, shared with the manager and kube-proxy")
		Expect(c.Env).To(ContainElement(And(HaveField("Name", "ENGINE_DETACH"), HaveField("Value", "true"))))
	})

	It("keeps the node's own Docker Engine in config/node-docker, without the Engine DaemonSet", func() {
		nd := render("config/node-docker")
		var got []string
		for _, o := range nd {
			got = append(got, o.GetKind()+" "+nsName(o))
		}
		var want []string
		for _, o := range objs {
			if o.GetKind() == "DaemonSet" && o.GetName() == "code-sandbox-engine" {
				continue
			}
			want = append(want, o.GetKind()+" "+nsName(o))
		}
		Expect(got).To(ConsistOf(want))
		ds := &appsv1.DaemonSet{}
		convert(find(nd, "DaemonSet", "code-sandbox-controller-manager"), ds)
		pod := ds.Spec.Template.Spec
		c := pod.Containers[0]
		Expect(c.Args).To(ContainElement("--docker-host=unix:///var/run/docker.sock"))
		Expect(c.Args).NotTo(ContainElement(ContainSubstring(engineSocketDir)))
		socket := hostPathVolume(pod, "/var/run/docker.sock")
		Expect(socket).NotTo(BeNil(), "the Docker socket volume")
		Expect(socket.HostPath.Type).To(HaveValue(Equal(corev1.HostPathSocket)), "fail the Pod rather than mount an empty directory")
		Expect(c.VolumeMounts).To(ContainElement(And(HaveField("Name", socket.Name), HaveField("MountPath", "/var/run/docker.sock"))))
		Expect(hostPathVolume(pod, engineSocketDir)).To(BeNil())
		for _, m := range c.VolumeMounts {
			Expect(pod.Volumes).To(ContainElement(HaveField("Name", m.Name)), "mount %s has a volume", m.Name)
		}
	})

	It("runs the webhook highly available with the names its arguments spell out", func() {
		d := &appsv1.Deployment{}
		convert(find(objs, "Deployment", "code-sandbox-webhook"), d)
		Expect(d.Spec.Replicas).To(HaveValue(BeEquivalentTo(2)))
		Expect(d.Spec.Strategy.RollingUpdate).NotTo(BeNil())
		Expect(d.Spec.Strategy.RollingUpdate.MaxUnavailable).To(HaveValue(Equal(intstr.FromInt32(0))))
		Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal("code-sandbox-webhook"))
		Expect(d.Spec.Template.Spec.Containers).To(HaveLen(1))
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(managerImage), "the webhook runs the manager's image")
		Expect(c.Command).To(Equal([]string{"/manager"}))
		args := flags(c.Args)
		Expect(args).To(HaveKeyWithValue("--role", "control-plane"))
		Expect(args).To(HaveKeyWithValue("--webhook-bind-address", ":9443"))
		Expect(args).To(HaveKeyWithValue("--webhook-namespace", "$(POD_NAMESPACE)"))
		Expect(args).To(HaveKeyWithValue("--webhook-service", "code-sandbox-webhook-service"))
		Expect(args).To(HaveKeyWithValue("--webhook-configuration", "code-sandbox-validating-webhook-configuration"))
		Expect(args).To(HaveKeyWithValue("--webhook-cert-secret", "code-sandbox-webhook-server-cert"))
		Expect(args).To(HaveKey("--leader-elect"))
		// The arguments name objects that kustomize renamed: they must
		// still be the rendered names.
		find(objs, "Service", args["--webhook-service"])
		find(objs, "ValidatingWebhookConfiguration", args["--webhook-configuration"])
		Expect(c.Env).To(ContainElement(And(
			HaveField("Name", "POD_NAMESPACE"),
			HaveField("ValueFrom.FieldRef.FieldPath", "metadata.namespace"))))
		Expect(c.Ports).To(ContainElement(And(HaveField("Name", "webhook"), HaveField("ContainerPort", BeEquivalentTo(9443)))))
		Expect(c.VolumeMounts).To(ContainElement(HaveField("MountPath", "/tmp")), "it writes its serving certificate to /tmp")
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))

		pdb := &policyv1.PodDisruptionBudget{}
		convert(find(objs, "PodDisruptionBudget", "code-sandbox-webhook"), pdb)
		Expect(pdb.Spec.MinAvailable).To(HaveValue(Equal(intstr.FromInt32(1))))
		Expect(selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels)).To(BeTrue(), "the PodDisruptionBudget must select the webhook pods")
		expectServiceReaches(find(objs, "Service", "code-sandbox-webhook-service"), d)
	})

	It("lets traffic reach the webhook pods only on the ports they serve", func() {
		d := &appsv1.Deployment{}
		convert(find(objs, "Deployment", "code-sandbox-webhook"), d)
		np := &networkingv1.NetworkPolicy{}
		convert(find(objs, "NetworkPolicy", "code-sandbox-webhook-ingress"), np)
		Expect(np.Namespace).To(Equal(d.Namespace))
		Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}))
		Expect(selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels)).To(BeTrue(), "the NetworkPolicy must select the webhook pods")
		Expect(np.Spec.PodSelector.MatchExpressions).To(BeEmpty())
		// One rule, any source (kube-apiserver's address is not portable),
		// every port named: without ports a rule would open them all.
		Expect(np.Spec.Ingress).To(HaveLen(1))
		rule := np.Spec.Ingress[0]
		Expect(rule.From).To(BeEmpty())
		var open []int32
		for _, p := range rule.Ports {
			Expect(p.Protocol).To(HaveValue(Equal(corev1.ProtocolTCP)))
			Expect(p.Port).NotTo(BeNil())
			Expect(p.EndPort).To(BeNil(), "no port ranges")
			open = append(open, p.Port.IntVal)
		}
		// Exactly the container's ports: the webhook, the aggregated API,
		// metrics and health.
		var served []int32
		for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
			served = append(served, p.ContainerPort)
		}
		Expect(open).To(ConsistOf(served))
		Expect(open).To(ConsistOf(int32(9443), int32(8443), int32(8080), int32(8081)))
	})

	It("runs three MCP server replicas on the kubernetes backend, spread over nodes, drained on SIGTERM, reachable through their Service", func() {
		d := &appsv1.Deployment{}
		convert(find(objs, "Deployment", "code-sandbox-mcp-server"), d)
		Expect(d.Spec.Replicas).To(HaveValue(BeEquivalentTo(3)))
		Expect(d.Spec.Strategy.RollingUpdate).NotTo(BeNil())
		Expect(d.Spec.Strategy.RollingUpdate.MaxUnavailable).To(HaveValue(Equal(intstr.FromInt32(0))), "a rollout must never go below the replicas")
		Expect(d.Spec.Template.Spec.TopologySpreadConstraints).To(ContainElement(And(
			HaveField("TopologyKey", "kubernetes.io/hostname"),
			HaveField("WhenUnsatisfiable", corev1.DoNotSchedule),
			HaveField("MatchLabelKeys", ContainElement("pod-template-hash")),
			HaveField("LabelSelector.MatchLabels", d.Spec.Template.Labels))))
		pdb := &policyv1.PodDisruptionBudget{}
		convert(find(objs, "PodDisruptionBudget", "code-sandbox-mcp-server"), pdb)
		Expect(pdb.Spec.MaxUnavailable).To(HaveValue(Equal(intstr.FromInt32(1))))
		Expect(selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels)).To(BeTrue(), "the PodDisruptionBudget must select the MCP server pods")
		Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal("code-sandbox-mcp-server"))
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(mcpImage))
		Expect(c.Command).To(Equal([]string{"/code-sandbox-mcp"}))
		args := flags(c.Args)
		Expect(args).To(HaveKeyWithValue("--backend", "kubernetes"))
		Expect(args).To(HaveKeyWithValue("--auth", "kubernetes"))
		Expect(args).To(HaveKeyWithValue("--namespace", "sandboxes"))
		Expect(args).To(HaveKey("--allow-remote"))
		_, port, err := net.SplitHostPort(args["--http"])
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Ports).To(ContainElement(And(HaveField("Name", "http"), HaveField("ContainerPort", BeEquivalentTo(atoi(port))))))
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		// The pod outlives the drain: the delay plus the grace, which
		// defaults to the longest command plus a margin.
		drain, err := time.ParseDuration(args["--drain-delay"])
		Expect(err).NotTo(HaveOccurred(), "--drain-delay must be set behind a Service")
		Expect(drain).To(BeNumerically(">", 0))
		grace := mcpserver.DefaultMaxTimeout + mcpmain.DefaultShutdownMargin
		if v, ok := args["--shutdown-grace"]; ok {
			grace, err = time.ParseDuration(v)
			Expect(err).NotTo(HaveOccurred())
		}
		if v, ok := args["--max-command-timeout"]; ok {
			mct, err := time.ParseDuration(v)
			Expect(err).NotTo(HaveOccurred())
			Expect(grace).To(BeNumerically(">=", mct), "a stopping replica would cut a command it allowed")
		} else {
			Expect(grace).To(BeNumerically(">=", mcpserver.DefaultMaxTimeout), "a stopping replica would cut a command it allowed")
		}
		Expect(d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(HaveValue(BeNumerically(">", (drain + grace).Seconds())))

		svcObj := find(objs, "Service", "code-sandbox-mcp-server")
		expectServiceReaches(svcObj, d)
		svc := &corev1.Service{}
		convert(svcObj, svc)
		Expect(svc.Spec.Ports).To(ContainElement(And(HaveField("Name", "http"), HaveField("Port", BeEquivalentTo(8080)))))
		// Requests through the Service carry its DNS name as Host: the
		// server must accept it (DNS-rebinding protection), and advertise
		// it as its public URL.
		svcHost := svc.Name + "." + svc.Namespace + ".svc"
		Expect(strings.Split(args["--allowed-hosts"], ",")).To(ContainElements(svc.Name, svcHost, svcHost+".cluster.local"))
		u, err := url.Parse(args["--public-url"])
		Expect(err).NotTo(HaveOccurred())
		Expect(u.Hostname()).To(Equal(svcHost))
		Expect(u.Port()).To(Equal("8080"))
		Expect(u.Path).To(Equal("/mcp"))

		// Preview URLs: their own listener, a container port and a
		// Service port of their own, and URLs that name that Service port.
		_, pport, err := net.SplitHostPort(args["--preview-addr"])
		Expect(err).NotTo(HaveOccurred(), "--preview-addr must be set")
		Expect(pport).NotTo(Equal(port), "previews must be another origin than the MCP endpoint")
		Expect(c.Ports).To(ContainElement(And(HaveField("Name", "preview"), HaveField("ContainerPort", BeEquivalentTo(atoi(pport))))))
		Expect(svc.Spec.Ports).To(ContainElement(And(HaveField("Name", "preview"), HaveField("TargetPort", intstr.FromString("preview")))))
		var previewPort int32
		for _, p := range svc.Spec.Ports {
			if p.Name == "preview" {
				previewPort = p.Port
			}
		}
		pu, err := url.Parse(args["--preview-url"])
		Expect(err).NotTo(HaveOccurred())
		Expect(pu.Hostname()).To(Equal(svcHost))
		Expect(pu.Port()).To(Equal(strconv.Itoa(int(previewPort))))
	})
})

// find returns the object of kind and name, failing when there is none.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	GinkgoHelper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	Fail("no " + kind + " " + name + " in the rendered objects")
	return nil
}

// convert decodes an unstructured object into a typed one.
func convert(u *unstructured.Unstructured, into any) {
	GinkgoHelper()
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)).To(Succeed(), describe(u))
}

func nsName(o *unstructured.Unstructured) string {
	if o.GetNamespace() != "" {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

// flags maps "--name=value" arguments to their values ("" for "--name").
func flags(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		m[k] = v
	}
	return m
}

func atoi(s string) int {
	GinkgoHelper()
	v := intstr.Parse(s)
	Expect(v.Type).To(Equal(intstr.Int), "%q is not a port number", s)
	return v.IntValue()
}

func selects(selector, podLabels map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(podLabels))
}

// expectServiceReaches checks that a Service selects d's pods and that
// every target port is a port of d's container.
func expectServiceReaches(svcObj *unstructured.Unstructured, d *appsv1.Deployment) {
	GinkgoHelper()
	svc := &corev1.Service{}
	convert(svcObj, svc)
	Expect(svc.Namespace).To(Equal(d.Namespace))
	Expect(selects(svc.Spec.Selector, d.Spec.Template.Labels)).To(BeTrue(), "Service %s must select the pods of %s", svc.Name, d.Name)
	var names []string
	var numbers []int32
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			names = append(names, p.Name)
			numbers = append(numbers, p.ContainerPort)
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.Type == intstr.String {
			Expect(names).To(ContainElement(p.TargetPort.StrVal), "Service %s port %s", svc.Name, p.Name)
		} else {
			Expect(numbers).To(ContainElement(p.TargetPort.IntVal), "Service %s port %s", svc.Name, p.Name)
		}
	}
}

// hostPathVolume returns pod's hostPath volume of path, or nil.
func hostPathVolume(pod corev1.PodSpec, path string) *corev1.Volume {
	for i := range pod.Volumes {
		if v := pod.Volumes[i]; v.HostPath != nil && v.HostPath.Path == path {
			return &pod.Volumes[i]
		}
	}
	return nil
}
