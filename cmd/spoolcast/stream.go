package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/internal/wsclient"
)

// streamCommand is `spoolcast stream`: follow a user's live stream and print
// each frame as a line of JSON, as an app would receive it.
func streamCommand() (*flag.FlagSet, runFunc) {
	var centralURL, token, tokenFile, after string
	fs := newFlagSet("stream", "SPOOLCAST_TOKEN=… spoolcast stream [--central URL] [--after CURSOR]")
	fs.StringVar(&centralURL, "central", "http://127.0.0.1:8080", "central base URL")
	fs.StringVar(&token, "token", "", "the user's bearer token (prefer the environment variable: a flag shows in ps)")
	fs.StringVar(&tokenFile, "token-file", "", "file holding the user's bearer token")
	fs.StringVar(&after, "after", "", "resume after this stream cursor (the cursor of the last frame seen)")
	return fs, func(ctx context.Context, _ []string) error {
		if tokenFile != "" {
			b, err := os.ReadFile(tokenFile)
			if err != nil {
				return err
			}
			token = strings.TrimSpace(string(b))
		}
		if token == "" {
			return errors.New("a token is required: SPOOLCAST_TOKEN, --token or --token-file (`spoolcast dev token` mints one for the dev stack)")
		}
		c, err := wsclient.Dial(ctx, centralURL, token, after)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { _ = c.CloseNormally() })
		defer stop()
		for {
			m, err := c.Next(time.Hour)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return nil // interrupted
				}
				if _, closed := wsclient.Closed(err); closed {
					return fmt.Errorf("%w (resume with --after and the last cursor)", err)
				}
				return err
			}
			fmt.Println(string(m.Raw))
		}
	}
}
