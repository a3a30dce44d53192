package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/webhook"
)

// maxWebhookBody bounds a body `webhook listen` reads: a notification's
// largest legal event with room for its envelope.
const maxWebhookBody = 1 << 20

// webhookCommand is `spoolcast webhook listen`: a receiver that verifies each
// delivery's signature as a subscriber must and prints it, to try an
// endpoint or debug one.
func webhookCommand() (*flag.FlagSet, runFunc) {
	var listen, secret, secretFile string
	fs := newFlagSet("webhook", "SPOOLCAST_SECRET=whsec_… spoolcast webhook listen [--listen ADDR]")
	fs.StringVar(&listen, "listen", "127.0.0.1:9090", "address to receive webhooks on")
	fs.StringVar(&secret, "secret", "", "the endpoint's signing secret, whsec_… (prefer the environment variable: a flag shows in ps)")
	fs.StringVar(&secretFile, "secret-file", "", "file holding the endpoint's signing secret")
	return fs, func(ctx context.Context, args []string) error {
		if len(args) != 1 || args[0] != "listen" {
			return errors.New("want one subcommand: webhook listen")
		}
		if secretFile != "" {
			b, err := os.ReadFile(secretFile)
			if err != nil {
				return err
			}
			secret = strings.TrimSpace(string(b))
		}
		if !strings.HasPrefix(secret, "whsec_") {
			return errors.New("a secret is required: SPOOLCAST_SECRET, --secret or --secret-file, whsec_… as POST /v1/admin/webhooks answered it")
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: webhookPrinter(secret, os.Stdout), ReadHeaderTimeout: 10 * time.Second}
		stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
		defer stop()
		fmt.Fprintf(os.Stderr, "receiving webhooks on http://%s/\n", ln.Addr())
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// webhookPrinter answers 204 to each delivery whose signature verifies and
// prints it; 401 to any other, saying why.
func webhookPrinter(secret string, out io.Writer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		id := r.Header.Get("webhook-id")
		if err := webhook.Verify(secret, id, r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), body, time.Now(), 0); err != nil {
			fmt.Fprintf(out, "refused webhook-id=%s: %v\n", id, err)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(out, "verified webhook-id=%s %s\n", id, body)
		w.WriteHeader(http.StatusNoContent)
	})
}
