package dockerruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/go-logr/logr"

	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
)

// PullFailure names the class of a failed pull. The class, never the
// daemon's text, is what callers may show to tenants: the daemon's error
// can carry fragments of the registry's response body.
type PullFailure string

const (
	PullImageNotFound       PullFailure = "image not found"
	PullUnauthorized        PullFailure = "unauthorized"
	PullRegistryUnreachable PullFailure = "registry unreachable"
	PullRegistryRefused     PullFailure = "registry refused"
	PullTimedOut            PullFailure = "timed out"
	PullFailed              PullFailure = "pull failed"
)

// PullError is a failed image pull. Its message is "ImagePullFailed:
// CLASS (pulling REF)" and nothing else.
type PullError struct {
	Ref   string
	Class PullFailure
	// Detail is the daemon's own error. It may contain registry response
	// bodies: log it for the operator, never show it to a tenant. It is
	// neither in Error() nor reachable through errors.Unwrap.
	Detail error
}

func (e *PullError) Error() string {
	return fmt.Sprintf("%s: %s (pulling %s)", ErrImagePullFailed, e.Class, e.Ref)
}

// Unwrap makes a PullError match ErrImagePullFailed and ErrImageNotFound.
func (e *PullError) Unwrap() []error { return []error{ErrImagePullFailed, ErrImageNotFound} }

// classifyPull maps the daemon's pull error to a PullFailure. The
// reference is cut out of the text first, so that its port or name cannot
// look like a status code.
func classifyPull(err error, ref string, timedOut bool) PullFailure {
	msg := strings.ToLower(err.Error())
	if ref = strings.ToLower(ref); ref != "" {
		msg = strings.ReplaceAll(msg, ref, "")
	}
	if registry, _ := imagepolicy.Registry(ref); registry != "" {
		msg = strings.ReplaceAll(msg, registry, "")
	}
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if strings.Contains(msg, sub) {
				return true
			}
		}
		return false
	}
	switch {
	case timedOut:
		return PullTimedOut
	case cerrdefs.IsUnauthorized(err), cerrdefs.IsPermissionDenied(err),
		has("unauthorized", "authentication required", "denied", "forbidden", "status: 401", "status: 403"):
		return PullUnauthorized
	case has("manifest unknown", "name unknown", "not found", "status: 404", "no matching manifest"):
		return PullImageNotFound
	case has("connection refused", "no such host", "network is unreachable", "host is unreachable",
		"i/o timeout", "connection reset", "eof", "tls", "x509", "certificate", "http response to https client",
		"dial tcp", "lookup ", "timeout"):
		return PullRegistryUnreachable
	case has("status", "response", "unexpected http", "error parsing http"):
		return PullRegistryRefused
	}
	return PullFailed
}

// EnsureImage makes the image present according to the pull policy. The
// image policy is checked first, whether the image is present or not, so a
// refused registry is never contacted. A failed pull is a *PullError, whose
// message names the failure class only; the daemon's text is logged (to
// ctx's logr logger) and kept in PullError.Detail.
func (c *Client) EnsureImage(ctx context.Context, ref string, policy PullPolicy) error {
	if err := c.imagePolicy.Check(ref); err != nil {
		return err
	}
	present := func() (bool, error) {
		ictx, cancel := c.bounded(ctx)
		defer cancel()
		_, err := c.docker.ImageInspect(ictx, ref)
		if err == nil {
			return true, nil
		}
		if cerrdefs.IsNotFound(err) {
			return false, nil
		}
		return false, classify(err, "inspecting image "+ref)
	}
	if policy != PullAlways {
		ok, err := present()
		if err != nil || ok {
			return err
		}
		if policy == PullNever {
			return fmt.Errorf("%w: %s is not present on the node and imagePullPolicy is Never", ErrImageNotFound, ref)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, c.pullTimeout)
	defer cancel()
	rc, err := c.docker.ImagePull(pctx, ref, image.PullOptions{})
	if err == nil {
		err = drainPull(rc)
	}
	if err != nil {
		// Only a failure to reach the daemon itself means Docker is
		// unavailable. The daemon's own pull errors (a registry refusing
		// the connection, even a 503) mean the image cannot be had.
		var netErr net.Error
		if client.IsErrConnectionFailed(err) || (errors.As(err, &netErr) && !errors.Is(err, context.DeadlineExceeded)) {
			return classify(err, "pulling image "+ref)
		}
		// An Always policy may still run a cached image when the registry
		// is unreachable, as kubelet does not; we stay strict and report.
		// The daemon's text may quote the registry's response: it goes to
		// the operator's log only.
		timedOut := errors.Is(err, context.DeadlineExceeded) || (pctx.Err() != nil && ctx.Err() == nil)
		pe := &PullError{Ref: ref, Class: classifyPull(err, ref, timedOut), Detail: err}
		logr.FromContextOrDiscard(ctx).Info("image pull failed", "image", ref, "class", string(pe.Class), "error", err.Error())
		return pe
	}
	return nil
}

// drainPull reads the pull progress stream to its end; errors arrive inside
// the stream as JSON messages.
func drainPull(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if i := bytes.Index(line, []byte(`"error":`)); i >= 0 {
			return errors.New(strings.TrimSpace(string(line)))
		}
	}
	return nil
}

// ensureFillerImage makes the trusted tools filler image present and
// returns its image ID, never its tag: the tag is a public name, and a
// tenant's `imagePullPolicy: Always` pull of
// code-sandbox-operator/tools-filler:<hash> re-points it on the node to
// whatever a registry serves. The ID is a content address (the digest of
// the image's configuration, which lists its layers' digests), so the image
// is verified once by content (fillerImageOK) and then used by ID: the ID
// this client imported or verified, re-checked on every use. A tag that
// names anything else is imported over (the tag is only a convenience for
// finding the image again after a restart).
func (c *Client) ensureFillerImage(ctx context.Context) (string, error) {
	if c.fillerID != "" {
		img, err := c.docker.ImageInspect(ctx, c.fillerID)
		if err == nil && fillerImageOK(img) {
			return c.fillerID, nil
		}
		if err != nil && !cerrdefs.IsNotFound(err) {
			return "", classify(err, "inspecting the tools filler image")
		}
		c.fillerID = "" // removed (docker image prune): import it again
	}
	ref := ToolsFillerImage()
	img, err := c.docker.ImageInspect(ctx, ref)
	switch {
	case err == nil && fillerImageOK(img):
		c.fillerID = img.ID
		return img.ID, nil
	case err == nil:
		logr.FromContextOrDiscard(ctx).Info("the tools filler tag names an image that is not the filler; importing the filler again", "tag", ref, "image", img.ID)
	case !cerrdefs.IsNotFound(err):
		return "", classify(err, "inspecting the tools filler image")
	}
	rc, err := c.docker.ImageImport(ctx, image.ImportSource{Source: bytes.NewReader(fillerRootfs()), SourceName: "-"}, ref,
		image.ImportOptions{Changes: fillerImportChanges, Message: "code-sandbox-operator tools volume filler"})
	var id string
	if err == nil {
		id, err = drainImport(rc)
	}
	if err != nil {
		return "", classify(err, "importing the tools filler image")
	}
	// Verified by the ID the import reported, never by the tag, which a
	// concurrent pull may already have re-pointed.
	if img, err = c.docker.ImageInspect(ctx, id); err != nil {
		return "", classify(err, "inspecting the imported tools filler image")
	}
	if !fillerImageOK(img) {
		return "", fmt.Errorf("the imported tools filler image %s does not have the filler's content", id)
	}
	c.fillerID = img.ID
	return img.ID, nil
}

// drainImport reads an image import's progress stream to its end and
// returns the image ID it reports ({"status":"sha256:…"}).
func drainImport(rc io.ReadCloser) (string, error) {
	defer rc.Close()
	var id string
	dec := json.NewDecoder(io.LimitReader(rc, 1<<20))
	for {
		var m struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("reading the import's response: %w", err)
		}
		if m.Error != "" {
			return "", errors.New(m.Error)
		}
		if strings.HasPrefix(m.Status, "sha256:") {
			id = strings.TrimSpace(m.Status)
		}
	}
	if id == "" {
		return "", errors.New("the image import reported no image ID")
	}
	return id, nil
}

// DefaultPathEnv is the PATH a container gets when neither its image nor
// its spec sets one: containerd's (and runc's) standard default.
const DefaultPathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// defaultPath adds PATH=DefaultPathEnv to cfg's environment when the image
// configuration has no PATH (images made with `docker import` or
// debootstrap) and the spec sets none, so that the helper finds commands by
// name ("sh") whatever the engine adds on its own. A PATH in the spec, or in
// an exec's environment, still wins.
func (c *Client) defaultPath(ctx context.Context, ref string, cfg *container.Config) error {
	for _, kv := range cfg.Env {
		if strings.HasPrefix(kv, "PATH=") {
			return nil
		}
	}
	ictx, cancel := c.bounded(ctx)
	defer cancel()
	img, err := c.docker.ImageInspect(ictx, ref)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("%w: %s is not present on the node", ErrImageNotFound, ref)
		}
		return classify(err, "inspecting image "+ref)
	}
	if img.Config != nil {
		for _, kv := range img.Config.Env {
			if strings.HasPrefix(kv, "PATH=") {
				return nil
			}
		}
	}
	cfg.Env = append(cfg.Env, "PATH="+DefaultPathEnv)
	return nil
}
