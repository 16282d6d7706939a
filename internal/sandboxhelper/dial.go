package sandboxhelper

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// dialTimeout bounds the connect to the sandbox's own loopback, which
// answers at once (accepted or refused) unless the listener's backlog is
// full.
const dialTimeout = 5 * time.Second

// parseDial reads `dial --port=N`.
func parseDial(args []string) (int, error) {
	if len(args) != 1 || !strings.HasPrefix(args[0], "--port=") {
		return 0, errors.New("dial takes --port=N")
	}
	port, err := strconv.Atoi(strings.TrimPrefix(args[0], "--port="))
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("dial: --port must be 1-65535, got %q", strings.TrimPrefix(args[0], "--port="))
	}
	return port, nil
}

// dialError is a failed connect to the sandbox's port, port_closed when
// nothing listens.
func dialError(port int, err error) *helperproto.Error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return &helperproto.Error{Kind: helperproto.KindPortClosed,
			Message: fmt.Sprintf("nothing is listening on port %d in the sandbox (127.0.0.1:%d refused the connection)", port, port)}
	}
	return &helperproto.Error{Kind: helperproto.KindOther, Message: fmt.Sprintf("connecting to port %d in the sandbox: %v", port, err)}
}

// dial connects to 127.0.0.1:port in the sandbox's network namespace (the
// helper runs inside it, so no network of the sandbox's is needed: it works
// with network None) and relays bytes: stdin to the connection, the
// connection to stdout. Once connected it writes helperproto.DialConnected
// on stderr, so the caller knows the port answered before it relays
// anything; a refusal is the usual error line (kind port_closed).
//
// The relay ends when the connection's read side ends (the server closed),
// after stdin's end has been passed on as a half-close.
func dial(port int, stdin io.Reader, stdout, stderr io.Writer) int {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return report(stderr, dialError(port, err))
	}
	defer conn.Close()
	if _, err := io.WriteString(stderr, helperproto.DialConnected); err != nil {
		return helperproto.ExitOther
	}
	tcp := conn.(*net.TCPConn)
	go func() {
		_, _ = io.Copy(tcp, stdin)
		_ = tcp.CloseWrite()
	}()
	if _, err := io.Copy(stdout, tcp); err != nil {
		return helperproto.ExitOther
	}
	if f, ok := stdout.(*os.File); ok {
		_ = f.Close()
	}
	return 0
}
