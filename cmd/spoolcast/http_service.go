package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// httpService is one HTTP server on one listener, with the life every
// long-running subcommand shares: serve in the background, wait for a signal or
// a failure, shut down gracefully.
type httpService struct {
	server *http.Server
	served chan error
}

func serveHTTP(ln net.Listener, h http.Handler, logger *slog.Logger) *httpService {
	s := &httpService{
		server: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		served: make(chan error, 1),
	}
	go func() { s.served <- s.server.Serve(ln) }()
	return s
}

// wait returns nil when ctx is cancelled, or the error of a server that
// stopped on its own.
func (s *httpService) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.served:
		s.served <- err
		return fmt.Errorf("serve: %w", err)
	}
}

// stop stops accepting and waits for the requests in flight until ctx ends.
func (s *httpService) stop(ctx context.Context) error {
	err := s.server.Shutdown(ctx)
	if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
