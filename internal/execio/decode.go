/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package execio

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// DecodeRequest reads one JSON Request from r, bounding command and env by
// count and bytes while it streams them (MaxArgs, MaxArgBytes, MaxEnv,
// MaxEnvBytes), so a body of millions of empty strings is refused after the
// first MaxArgs+1 instead of being decoded whole: decoding them all would
// cost ~30 bytes of heap per input byte. Errors from the bounds wrap
// ErrInvalidRequest; JSON syntax errors and r's own errors (such as
// *http.MaxBytesError) are returned wrapped. The result is not yet
// Normalized. Request's fields are listed here by their JSON names: a field
// added to Request must be added here too (TestDecodeRequestMatchesJSON
// catches one that is not).
func DecodeRequest(r io.Reader) (Request, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return Request{}, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return Request{}, fmt.Errorf("%w: the request is not a JSON object", ErrInvalidRequest)
	}
	var req Request
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Request{}, err
		}
		key, _ := tok.(string)
		// Each field is decoded in place, with no second copy of the body.
		// Names match case-insensitively, as encoding/json matches them:
		// "Command" must not slip past the bound. A repeated name wins last,
		// as there.
		var into any
		switch strings.ToLower(key) {
		case "command":
			if req.Command, err = decodeStrings(dec, "command", MaxArgs, MaxArgBytes); err != nil {
				return Request{}, err
			}
			continue
		case "env":
			if req.Env, err = decodeStrings(dec, "env", MaxEnv, MaxEnvBytes); err != nil {
				return Request{}, err
			}
			continue
		case "shell":
			into = &req.Shell
		case "workingdir":
			into = &req.WorkingDir
		case "stdin":
			into = &req.Stdin
		case "timeoutseconds":
			into = &req.TimeoutSeconds
		case "outputlimitbytes":
			into = &req.OutputLimitBytes
		default: // unknown fields are ignored, as encoding/json ignores them
			into = &json.RawMessage{}
		}
		if err := dec.Decode(into); err != nil {
			return Request{}, fmt.Errorf("field %q: %w", key, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return Request{}, err
	}
	return req, nil
}

// decodeStrings streams a JSON array of strings (or null), refusing it as
// soon as it passes maxCount entries or maxBytes (each counted with a NUL).
func decodeStrings(dec *json.Decoder, field string, maxCount, maxBytes int) ([]string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%w: %s must be an array of strings", ErrInvalidRequest, field)
	}
	var out []string
	total := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		s, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%w: %s[%d] is not a string", ErrInvalidRequest, field, len(out))
		}
		if len(out) >= maxCount {
			return nil, fmt.Errorf("%w: %s has more than the %d entries allowed", ErrInvalidRequest, field, maxCount)
		}
		if total += len(s) + 1; total > maxBytes {
			return nil, fmt.Errorf("%w: %s is more than the %d bytes allowed", ErrInvalidRequest, field, maxBytes)
		}
		out = append(out, s)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, err
	}
	return out, nil
}
