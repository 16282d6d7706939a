//go:build linux

package dockerbackend

import (
	"os"
	"testing"
)

func TestInstanceRoundTrip(t *testing.T) {
	in := Instance{Host: "host:with:colons", Boot: "abc", PID: 42, Start: 99}
	out, ok := ParseInstance(in.String())
	if !ok || out != in {
		t.Fatalf("round trip: %+v %v", out, ok)
	}
	for _, bad := range []string{"", "n1", "mcp:", "mcp:h:b:x:1", "mcp:h:b:0:1", "code-sandbox:h:b:1:1"} {
		if _, ok := ParseInstance(bad); ok {
			t.Errorf("ParseInstance(%q) accepted", bad)
		}
	}
}

func TestLiveness(t *testing.T) {
	self, err := CurrentInstance()
	if err != nil {
		t.Fatal(err)
	}
	if got := self.Check(self); got != Alive {
		t.Errorf("self: %v", got)
	}
	other := self
	other.Host = "elsewhere"
	if got := self.Check(other); got != Unknown {
		t.Errorf("other host: %v", got)
	}
	other = self
	other.Boot = "previous-boot"
	if got := self.Check(other); got != Unknown {
		t.Errorf("other boot: %v", got)
	}
	// The parent is alive; with another start time it is a reused PID.
	parent := self
	parent.PID = os.Getppid()
	parent.Start, _ = processStart(parent.PID)
	if got := self.Check(parent); got != Alive {
		t.Errorf("parent: %v", got)
	}
	parent.Start++
	if got := self.Check(parent); got != Dead {
		t.Errorf("reused PID: %v", got)
	}
	gone := self
	gone.PID = 1 << 30
	if got := self.Check(gone); got != Dead {
		t.Errorf("missing PID: %v", got)
	}
}
