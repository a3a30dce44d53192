package auth_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/auth"
)

func TestWebSocketTokenRidesInTheSubprotocolList(t *testing.T) {
	cases := []struct {
		name      string
		protocols []string
		authz     string
		want      string
		err       error
	}{
		{name: "token after the protocol", protocols: []string{"spoolcast.bearer.v1, eyJ.a.b"}, want: "eyJ.a.b"},
		{name: "two header lines", protocols: []string{"spoolcast.bearer.v1", "eyJ.a.b"}, want: "eyJ.a.b"},
		{name: "no spaces", protocols: []string{"spoolcast.bearer.v1,eyJ.a.b"}, want: "eyJ.a.b"},
		{name: "Authorization without subprotocols", authz: "Bearer eyJ.a.b", want: "eyJ.a.b"},
		{name: "nothing", err: auth.ErrNoToken},
		{name: "protocol without token", protocols: []string{"spoolcast.bearer.v1"}, err: auth.ErrNoToken},
		{name: "token without protocol", protocols: []string{"eyJ.a.b"}, err: auth.ErrBadToken},
		{name: "two tokens", protocols: []string{"spoolcast.bearer.v1, a, b"}, err: auth.ErrBadToken},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodGet, "http://x/v1/stream", nil)
			for _, p := range c.protocols {
				r.Header.Add("Sec-WebSocket-Protocol", p)
			}
			if c.authz != "" {
				r.Header.Set("Authorization", c.authz)
			}
			got, err := auth.WebSocketToken(r)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				if err != nil && strings.Contains(err.Error(), "eyJ") {
					t.Errorf("the error %q repeats the token", err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("token = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func FuzzWebSocketToken(f *testing.F) {
	f.Add("spoolcast.bearer.v1, eyJhbGciOiJFUzI1NiJ9.e30.sig")
	f.Add("spoolcast.bearer.v1,,")
	f.Add(" , spoolcast.bearer.v1 ,x")
	f.Add("x, spoolcast.bearer.v1")
	f.Fuzz(func(t *testing.T, header string) {
		r, _ := http.NewRequest(http.MethodGet, "http://x/v1/stream", nil)
		r.Header.Set("Sec-WebSocket-Protocol", header)
		token, err := auth.WebSocketToken(r)
		if err != nil {
			if token != "" {
				t.Fatalf("token %q with error %v", token, err)
			}
			if !errors.Is(err, auth.ErrNoToken) && !errors.Is(err, auth.ErrBadToken) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if token == "" || token == auth.WebSocketProtocol || strings.ContainsAny(token, ",") || strings.TrimSpace(token) != token {
			t.Fatalf("token %q from %q", token, header)
		}
		if !strings.Contains(header, token) || !strings.Contains(header, auth.WebSocketProtocol) {
			t.Fatalf("token %q is not the header's other entry: %q", token, header)
		}
	})
}
