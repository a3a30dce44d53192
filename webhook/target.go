package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spoolcast/spoolcast/internal/egress"
)

// MaxURLLen bounds an endpoint's URL.
const MaxURLLen = 2048

// ErrPrivateTarget: the URL's host is, or resolves to, an address on
// loopback, link-local or a private range, which only
// --webhook-allow-private permits.
var ErrPrivateTarget = egress.ErrPrivate

// CheckURL says whether raw can be an endpoint: an absolute http or https
// URL without credentials, whose host resolves only to public addresses
// unless allowPrivate. The check at delivery is the dialer's (Client): a
// name may resolve differently later.
func CheckURL(ctx context.Context, raw string, allowPrivate bool) error {
	if len(raw) > MaxURLLen {
		return fmt.Errorf("longer than %d bytes", MaxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return errors.New("want an http or https URL")
	}
	if u.User != nil {
		return errors.New("credentials in the URL are not accepted; the signature authenticates spoolcast to the receiver")
	}
	if u.Hostname() == "" || u.Opaque != "" {
		return errors.New("no host")
	}
	if u.Fragment != "" {
		return errors.New("a fragment is never sent")
	}
	if allowPrivate {
		return nil
	}
	return egress.CheckHost(ctx, raw)
}

// Client returns the HTTP client deliveries use (egress.Client): the
// dialer refuses non-public addresses at connect time unless allowPrivate,
// whatever the name resolved to when the endpoint was created, and no
// redirect is followed. It keeps perHost connections alive per receiver,
// one per attempt in flight.
func Client(timeout time.Duration, allowPrivate bool, perHost int) *http.Client {
	return egress.Client(timeout, allowPrivate, perHost)
}
