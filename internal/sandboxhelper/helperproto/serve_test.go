/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package helperproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var stream []byte
	stream = AppendFrame(stream, FrameStdout, []byte("hello"))
	stream = AppendFrame(stream, FrameExit, ExitPayload(-3))
	r := bytes.NewReader(stream)
	kind, payload, err := ReadFrameInto(r, make([]byte, 8))
	if err != nil || kind != FrameStdout || string(payload) != "hello" {
		t.Fatalf("first frame: %q %q %v", kind, payload, err)
	}
	kind, payload, err = ReadFrame(r, 4)
	if err != nil || kind != FrameExit {
		t.Fatalf("second frame: %q %v", kind, err)
	}
	if code, err := ParseExit(payload); err != nil || code != -3 {
		t.Fatalf("exit code %d, %v", code, err)
	}
	if _, _, err := ReadFrame(r, 4); !errors.Is(err, io.EOF) {
		t.Fatalf("between frames: %v, want io.EOF", err)
	}
}

func TestFramesRefuseHostileInput(t *testing.T) {
	// A 4 GiB announcement is refused from its header.
	huge := []byte{FrameStdout, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := ReadFrame(bytes.NewReader(huge), MaxOutputFrame); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("huge frame: %v, want ErrFrameTooLarge", err)
	}
	if _, _, err := ReadFrameInto(bytes.NewReader(AppendFrame(nil, FrameStdout, make([]byte, 9))), make([]byte, 8)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("frame over the buffer: %v, want ErrFrameTooLarge", err)
	}
	cut := AppendFrame(nil, FrameStdout, []byte("abcdef"))[:7]
	if _, _, err := ReadFrame(bytes.NewReader(cut), 64); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut frame: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ParseExit([]byte{1, 2}); err == nil {
		t.Fatal("a short exit payload must be refused")
	}
}

// The ready frame's payload comes from a process the sandbox can tamper
// with: anything but a well-formed, bounded list is a helper without
// features (the slower, older paths), never an error.
func TestParseReady(t *testing.T) {
	valid := []byte(`{"features":["x","` + FeatureStreamedUntar + `"]}`)
	if !ParseReady(valid).Has(FeatureStreamedUntar) {
		t.Fatalf("a listed feature is not seen")
	}
	for name, payload := range map[string][]byte{
		"empty (an older helper)": nil,
		"garbage":                 []byte("{not json"),
		"wrong type":              []byte(`{"features":"` + FeatureStreamedUntar + `"}`),
		"over the bound":          append(append([]byte(`{"features":["`+FeatureStreamedUntar+`"],"pad":"`), bytes.Repeat([]byte("p"), MaxReadyPayload)...), `"}`...),
		"other features only":     []byte(`{"features":["streamed-untar2"]}`),
	} {
		if ParseReady(payload).Has(FeatureStreamedUntar) {
			t.Errorf("%s: taken as having the feature", name)
		}
	}
}
