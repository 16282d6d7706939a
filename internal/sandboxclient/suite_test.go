package sandboxclient_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestSandboxClient(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "sandboxclient unit suite")
}
