package transport

import (
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"

	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authnv1 "k8s.io/api/authentication/v1"
)

var _ = Describe("caller authorization over HTTP", Label("unit"), func() {
	It("answers 403 naming what is missing, after authentication", func() {
		fr := &fakeReviewer{status: authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "bob"}, Audiences: []string{auth.DefaultTokenAudience}}}
		authn := auth.WithAuthorization(auth.NewTokenReviewAuthWith(fr, nil), auth.AllowList{Users: []string{"alice"}})
		s, err := mcpserver.New(mcpserver.Config{}, nil, slog.New(slog.DiscardHandler))
		Expect(err).NotTo(HaveOccurred())
		h, err := NewHTTPServer(s, HTTPOptions{ResourceURL: "http://127.0.0.1:8080/mcp", AllowedHosts: []string{"127.0.0.1:8080"}, Auth: authn, Logger: slog.New(slog.DiscardHandler)})
		Expect(err).NotTo(HaveOccurred())
		// Shutdown stops the session sweeper that NewHTTPServer starts.
		DeferCleanup(func() { _ = h.Shutdown(context.Background()) })
		do := func(token string) *httptest.ResponseRecorder {
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			r.Host = "127.0.0.1:8080"
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer "+token)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		w := do("bobs-token")
		Expect(w.Code).To(Equal(http.StatusForbidden), "body %s", w.Body)
		Expect(w.Body.String()).To(And(HavePrefix("Forbidden: user \"bob\""), ContainSubstring("--allow-user")))

		fr.status.User.Username = "alice"
		Expect(do("alices-token").Code).NotTo(BeElementOf(http.StatusForbidden, http.StatusUnauthorized))

		fr.status = authnv1.TokenReviewStatus{Error: "expired"}
		Expect(do("expired-token").Code).To(Equal(http.StatusUnauthorized), "a failed authentication is no longer 401")
	})
})
