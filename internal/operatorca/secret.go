/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package operatorca

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EnsureSecret returns the Secret key when usable accepts its data, and
// otherwise creates it, or replaces its data, with what fill returns (fill
// gets the old data, nil for a create). Replicas race safely: creates and
// updates are optimistic, and a replica that loses a race adopts the
// winner's Secret. written says whether this call stored new data. The CA
// and every certificate the operator keeps for itself are stored this way.
func EnsureSecret(ctx context.Context, c client.Client, key client.ObjectKey, secretType corev1.SecretType,
	usable func(map[string][]byte) bool, fill func(old map[string][]byte) (map[string][]byte, error)) (secret *corev1.Secret, written bool, err error) {
	for range 5 {
		secret = &corev1.Secret{}
		err := c.Get(ctx, key, secret)
		if apierrors.IsNotFound(err) {
			data, err := fill(nil)
			if err != nil {
				return nil, false, err
			}
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
				Type:       secretType,
				Data:       data,
			}
			err = c.Create(ctx, secret)
			if apierrors.IsAlreadyExists(err) {
				continue // another replica won; adopt theirs
			}
			if err != nil {
				return nil, false, fmt.Errorf("creating Secret %s: %w", key, err)
			}
			return secret, true, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("reading Secret %s: %w", key, err)
		}
		if usable(secret.Data) {
			return secret, false, nil
		}
		data, err := fill(secret.Data)
		if err != nil {
			return nil, false, err
		}
		secret.Data = data
		err = c.Update(ctx, secret)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("updating Secret %s: %w", key, err)
		}
		return secret, true, nil
	}
	return nil, false, fmt.Errorf("the Secret %s kept changing under us; giving up for now", key)
}
