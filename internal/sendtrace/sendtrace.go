// Package sendtrace tells, when an HTTP request failed without an answer,
// whether its server may have it whole, and so may have acted on it: a
// push sent again then could be delivered twice.
//
// The transport reports each attempt (net/http/httptrace): GotConn starts
// one, WroteRequest ends its write, with the write's error. A write that
// ended whole may have been acted on; one that failed left the server a
// request cut short, which none of the push providers acts on. One race is
// left, and decided towards sending at most once: when the request's
// context ends (its timeout, Client.Timeout, a stop), Do returns at once
// while the transport's writer may still be putting the request on the
// wire, and WroteRequest comes after. So an attempt that got a connection
// and has not reported its write counts as maybe received.
package sendtrace

import (
	"context"
	"net/http/httptrace"
	"sync/atomic"
)

// Write states of an attempt.
const (
	unreported int32 = iota
	whole
	failed
)

// Trace follows one request's attempts.
type Trace struct {
	conn  atomic.Bool  // the last attempt got a connection
	wrote atomic.Int32 // how its write ended, if it has
}

// With returns ctx with a trace of the requests made with it, and the
// trace. Use a ctx for one request.
func With(ctx context.Context) (context.Context, *Trace) {
	t := &Trace{}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			t.wrote.Store(unreported)
			t.conn.Store(true)
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				t.wrote.Store(whole)
			} else {
				t.wrote.Store(failed)
			}
		},
	}), t
}

// MaybeReceived reports whether the server may have the whole request:
// its write ended whole, or it got a connection and its write has not
// ended yet. Read it after Do returned an error.
func (t *Trace) MaybeReceived() bool {
	switch t.wrote.Load() {
	case whole:
		return true
	case failed:
		return false
	}
	return t.conn.Load()
}
