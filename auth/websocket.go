package auth

import (
	"fmt"
	"net/http"
	"strings"
)

// WebSocketProtocol is the subprotocol a WebSocket client names to carry its
// bearer token: browsers cannot set headers on a WebSocket, so the token
// rides as the other entry of Sec-WebSocket-Protocol. The server echoes only
// this name, never the token.
const WebSocketProtocol = "spoolcast.bearer.v1"

// WebSocketToken returns the bearer token of a WebSocket handshake: from
// "Sec-WebSocket-Protocol: spoolcast.bearer.v1, <token>", or else from an
// Authorization header (clients that can set one). ErrNoToken when neither
// carries one; ErrBadToken when the protocol list is not that shape.
func WebSocketToken(r *http.Request) (string, error) {
	values := r.Header.Values("Sec-WebSocket-Protocol")
	if len(values) == 0 {
		return BearerToken(r)
	}
	var named bool
	var tokens []string
	for _, v := range values {
		for p := range strings.SplitSeq(v, ",") {
			switch p = strings.TrimSpace(p); p {
			case "":
			case WebSocketProtocol:
				named = true
			default:
				tokens = append(tokens, p)
			}
		}
	}
	switch {
	case !named && len(tokens) > 0:
		return "", fmt.Errorf("%w: Sec-WebSocket-Protocol must name %s before the token", ErrBadToken, WebSocketProtocol)
	case !named:
		return BearerToken(r)
	case len(tokens) == 0:
		return "", ErrNoToken
	case len(tokens) > 1:
		return "", fmt.Errorf("%w: Sec-WebSocket-Protocol must carry one token after %s", ErrBadToken, WebSocketProtocol)
	}
	return tokens[0], nil
}

// AuthorizeWebSocket verifies the bearer token of a WebSocket handshake (see
// WebSocketToken) as Authorize does.
func (v *UserVerifier) AuthorizeWebSocket(r *http.Request) (User, error) {
	token, err := WebSocketToken(r)
	if err != nil {
		return User{}, err
	}
	return v.Verify(r.Context(), token)
}
