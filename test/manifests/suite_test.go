/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package manifests checks the deployment manifests under config/: every
// kustomization is rendered with the pinned kustomize and every object is
// applied, server-side and as a dry run, to envtest's real kube-apiserver,
// so that schema, CRD and RBAC errors fail here rather than on a cluster.
// It also asserts the properties of the rendered install that matter (the
// webhook fails closed, the pods are locked down, the names the arguments
// spell out match the objects) and, with real RBAC objects and
// SubjectAccessReviews, what the built-in admin, edit and view roles grant.
//
// kind cannot run here, so nothing is scheduled: this proves that the API
// server accepts the objects and what RBAC allows, not that the pods start.
package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

// fieldOwner is the field manager of everything this suite applies.
const fieldOwner = client.FieldOwner("manifests-test")

var (
	cp *testenv.ControlPlane
	// k8s refuses unknown fields (strict field validation), as kubectl
	// apply does by default.
	k8s client.Client
)

func TestManifests(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Deployment manifests suite (kustomize + envtest dry-run)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	Expect(kustomizeBinary()).NotTo(BeEmpty(),
		"KUSTOMIZE is not set: run the suite with `make test`, which provides bin/kustomize, or set KUSTOMIZE=$PWD/bin/kustomize")
	// kubeadm's Service range, as on the kind cluster: config/kind/deploy
	// fixes the snapshot registry's ClusterIP in it.
	cp = testenv.StartControlPlane(testenv.WithServiceRange("10.96.0.0/16"))
	k8s = client.WithFieldValidation(cp.Client, metav1.FieldValidationStrict)
})

var _ = AfterSuite(func() {
	cp.Stop()
})

func kustomizeBinary() string { return os.Getenv("KUSTOMIZE") }

// kustomizationDirs lists, relative to the repository root, every directory
// under config/ that holds a kustomization (any of the file names kustomize
// accepts), sorted.
func kustomizationDirs() []string {
	root := testenv.RepoPath()
	var dirs []string
	err := filepath.WalkDir(filepath.Join(root, "config"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if d.Name() == "kustomization.yaml" && strings.Contains(filepath.ToSlash(path), "/config/components/") {
			return nil // a kustomize Component renders only inside an overlay (webhook_client_auth_test.go)
		}
		switch d.Name() {
		case "kustomization.yaml", "kustomization.yml", "Kustomization":
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs = append(dirs, rel)
		}
		return nil
	})
	if err != nil {
		panic(fmt.Sprintf("walking config/: %v", err))
	}
	sort.Strings(dirs)
	return dirs
}

// render runs `$KUSTOMIZE build dir` (dir absolute, or relative to the repository root)
// and decodes every object it prints.
func render(dir string) []*unstructured.Unstructured {
	GinkgoHelper()
	bin := kustomizeBinary()
	Expect(bin).NotTo(BeEmpty(), "KUSTOMIZE is not set: run the suite with `make test`")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	path := dir
	if !filepath.IsAbs(path) {
		path = testenv.RepoPath(dir)
	}
	cmd := exec.CommandContext(ctx, bin, "build", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	Expect(cmd.Run()).To(Succeed(), "kustomize build %s failed:\n%s", dir, stderr.String())
	return decode(stdout.Bytes())
}

// decode splits a multi-document YAML stream into objects.
func decode(data []byte) []*unstructured.Unstructured {
	GinkgoHelper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		Expect(err).NotTo(HaveOccurred())
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		Expect(u.GetAPIVersion()).NotTo(BeEmpty(), "object without apiVersion: %v", m)
		Expect(u.GetKind()).NotTo(BeEmpty(), "object without kind: %v", m)
		objs = append(objs, u)
	}
	return objs
}

// namespaced reports whether the API server serves obj's kind in
// namespaces, failing when it does not know the kind at all.
func namespaced(obj *unstructured.Unstructured) bool {
	GinkgoHelper()
	ns, err := cp.Client.IsObjectNamespaced(obj)
	Expect(err).NotTo(HaveOccurred(), "the API server does not serve %s", obj.GroupVersionKind())
	return ns
}

// ensureNamespace creates namespace name for real, if it does not exist.
func ensureNamespace(ctx context.Context, name string) {
	GinkgoHelper()
	err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
}

// prepare gives namespaced objects without a namespace the "default" one,
// as kubectl apply would, and creates every namespace the objects need for
// real: the Namespace objects among them (applied, so their labels are
// checked too) and the namespaces the others are in. Dry-run objects in a
// namespace that does not exist would be refused.
func prepare(ctx context.Context, objs []*unstructured.Unstructured) {
	GinkgoHelper()
	for _, obj := range objs {
		if obj.GetKind() == "Namespace" && obj.GetAPIVersion() == "v1" {
			Expect(k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()), fieldOwner, client.ForceOwnership)).
				To(Succeed(), "applying Namespace %s", obj.GetName())
		}
	}
	for _, obj := range objs {
		if !namespaced(obj) {
			continue
		}
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		ensureNamespace(ctx, obj.GetNamespace())
	}
}

// applyDryRun applies obj server-side with dryRun=All: admission, schema,
// CRD validation (OpenAPI and CEL) and RBAC escalation checks all run, and
// nothing is stored.
func applyDryRun(ctx context.Context, obj *unstructured.Unstructured) error {
	return k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()), fieldOwner, client.ForceOwnership, client.DryRunAll)
}

// applyForReal applies obj server-side.
func applyForReal(ctx context.Context, obj *unstructured.Unstructured) error {
	return k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj.DeepCopy()), fieldOwner, client.ForceOwnership)
}

// describe names an object in failure messages.
func describe(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
	}
	return fmt.Sprintf("%s %s", obj.GetKind(), obj.GetName())
}
