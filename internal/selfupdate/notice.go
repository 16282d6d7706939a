/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package selfupdate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// CheckInterval is how often Notice asks the index at most.
const CheckInterval = 24 * time.Hour

// checkState is the file that keeps Notice to one check a day.
type checkState struct {
	CheckedAt time.Time `json:"checkedAt"`
	IndexURL  string    `json:"indexURL"`
	// Latest is the newest release whose signature verified ("" when the
	// check failed).
	Latest string `json:"latest,omitempty"`
}

// StatePath is the check state file in the user's cache directory.
func StatePath(binary string) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, binary, "update-check.json"), nil
}

// Notice returns a one-line notice when a newer signed release than
// o.CurrentVersion exists, and "" otherwise. It asks the index at most once
// per CheckInterval (a failed check counts), remembering the answer in the
// file statePath.
func Notice(ctx context.Context, o Options, statePath string, now time.Time) (string, error) {
	var st checkState
	if data, err := os.ReadFile(statePath); err == nil {
		_ = json.Unmarshal(data, &st) // a damaged file is a stale one
	}
	var checkErr error
	if st.IndexURL != o.IndexURL || now.Sub(st.CheckedAt) >= CheckInterval || now.Before(st.CheckedAt) {
		st = checkState{CheckedAt: now, IndexURL: o.IndexURL}
		var s Status
		s, _, checkErr = Check(ctx, o)
		if checkErr == nil {
			st.Latest = s.Latest
		}
		if err := writeState(statePath, st); err != nil && checkErr == nil {
			checkErr = fmt.Errorf("update check state: %w", err)
		}
	}
	if st.Latest != "" && compare(st.Latest, o.CurrentVersion) > 0 {
		return fmt.Sprintf("%s %s is available (this is %s): run `%s update`", o.Binary, st.Latest, o.CurrentVersion, o.Binary), checkErr
	}
	return "", checkErr
}

func writeState(path string, st checkState) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".update-check-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// ImageEnv is set by the project's container images (Dockerfile.mcp,
// Dockerfile): a binary in them is updated by a new image, never by itself.
const ImageEnv = "CODE_SANDBOX_IMAGE"

// ErrManaged refuses a self-update or an update check where the binary
// belongs to an image or a deployment.
var ErrManaged = errors.New("self-update is off here")

// Refusal says why this process must not update itself or check for
// updates: in the project's images and in Kubernetes pods always (the
// deployment updates them), in any other container unless allowContainer
// (containers are updated by rebuilding their image). getenv and exists
// are os.Getenv and a stat in production.
func Refusal(getenv func(string) string, exists func(string) bool, allowContainer bool) error {
	if getenv(ImageEnv) != "" {
		return fmt.Errorf("%w: this is a code-sandbox-operator container image (%s is set); images are updated by their deployment", ErrManaged, ImageEnv)
	}
	if getenv("KUBERNETES_SERVICE_HOST") != "" {
		return fmt.Errorf("%w: this runs in a Kubernetes pod (KUBERNETES_SERVICE_HOST is set); the deployment updates its image", ErrManaged)
	}
	if allowContainer {
		return nil
	}
	for _, f := range []string{"/.dockerenv", "/run/.containerenv"} {
		if exists(f) {
			return fmt.Errorf("%w: this runs in a container (%s exists); rebuild its image instead, or pass --allow-update-in-container to update this copy", ErrManaged, f)
		}
	}
	return nil
}

// FileExists is Refusal's exists.
func FileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
