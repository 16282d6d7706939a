/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package noderbac holds only the RBAC markers of operatorca.NodeCertificate,
// the node manager's side of the operator CA. They live apart from package
// operatorca because controller-gen builds each role from whole packages:
// operatorca's own markers go into the webhook's role (the CA holder and
// signer), these into the node manager's (`make manifests`).
package noderbac

// A manager requests its node API serving certificate with a CSR, waits for
// it, and deletes its used CSRs. RBAC cannot limit create or delete to the
// manager's own CSRs; the signer signs only for the node the requester's
// Pod-bound token names.
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch;delete

// The public CA bundle, in the operator namespace ("system" before
// kustomize's namespace transform). list and watch are limited to the name
// too, since the manager watches with a metadata.name field selector.
// +kubebuilder:rbac:groups="",namespace=system,resources=configmaps,verbs=get;list;watch,resourceNames=code-sandbox-operator-ca-bundle
