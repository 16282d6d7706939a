/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"io"
	"net"
	"os"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// dockerProxy forwards a unix socket to the real Docker socket and can be cut
// and restored, so a manager sees its Docker Engine go away mid-flight (open
// event stream included) and come back, without disturbing the real daemon.
type dockerProxy struct {
	path   string
	target string

	mu       sync.Mutex
	listener net.Listener
	conns    map[net.Conn]struct{}
}

func newDockerProxy(path, target string) *dockerProxy {
	GinkgoHelper()
	p := &dockerProxy{path: path, target: target, conns: map[net.Conn]struct{}{}}
	p.start()
	DeferCleanup(p.stop)
	return p
}

func (p *dockerProxy) start() {
	GinkgoHelper()
	_ = os.Remove(p.path)
	l, err := net.Listen("unix", p.path)
	Expect(err).NotTo(HaveOccurred())
	p.mu.Lock()
	p.listener = l
	p.mu.Unlock()
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("unix", p.target)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.track(client, upstream)
			go p.pipe(client, upstream)
			go p.pipe(upstream, client)
		}
	}()
}

func (p *dockerProxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
}

func (p *dockerProxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// stop closes the listener and every open connection, as a daemon crash
// would.
func (p *dockerProxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener != nil {
		_ = p.listener.Close()
		p.listener = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
	_ = os.Remove(p.path)
}
