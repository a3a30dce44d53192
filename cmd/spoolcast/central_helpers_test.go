package main

import (
	"io"
	"net/http"
	"testing"

	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/proctest"
)

// startCentralProcess runs `spoolcast central` on dbURL with a test issuer,
// without push or maintenance, and returns its base URL once it answers
// /healthz (on --ops-listen when flags set it), with the issuer for tokens.
func startCentralProcess(t *testing.T, dbURL string, flags ...string) (base string, iss *oidctest.Issuer) {
	t.Helper()
	iss = oidctest.New(t)
	addr := proctest.FreeAddr(t)
	args := append([]string{"central", "--listen", addr, "--database-url", dbURL,
		"--oidc-issuer", iss.URL(), "--oidc-audience", oidctest.Audience, "--jwks-url", iss.JWKSURL(),
		"--push=false", "--maintenance-interval", "0", "--log-level", "error"}, flags...)
	p := proctest.Start(t, nil, args...)
	base = "http://" + addr
	probes := base // with --ops-listen the probes are there
	for i, f := range flags {
		if f == "--ops-listen" && i+1 < len(flags) {
			probes = "http://" + flags[i+1]
		}
	}
	p.WaitHealthy(probes)
	return base, iss
}

// readyz asks base's /readyz and returns its status and body.
func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
