package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// expoClock stands in front of the fake Expo and notes, for every message a
// /send request carries, when the request arrived: the moment a real Expo
// would have the push. The fake answers as it always does.
type expoClock struct {
	next http.Handler
	l    *ledger
}

func (e *expoClock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/send") {
		e.next.ServeHTTP(w, r)
		return
	}
	at := time.Now()
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	plain := raw
	if r.Header.Get("Content-Encoding") == "gzip" {
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
			plain, _ = io.ReadAll(zr)
		}
	}
	var msgs []struct {
		To    string `json:"to"`
		Title string `json:"title"`
	}
	_ = json.Unmarshal(plain, &msgs)
	r.Body = io.NopCloser(bytes.NewReader(raw))
	e.next.ServeHTTP(w, r)
	for _, m := range msgs {
		user, ok := userOfToken(m.To)
		if !ok {
			e.l.mu.Lock()
			e.l.strays++
			e.l.mu.Unlock()
			continue
		}
		e.l.push(m.Title, user, at)
	}
}

// pushToken is user i's Expo token, one device each.
func pushToken(i int) string { return "ExponentPushToken[e2e-" + strconv.Itoa(i) + "]" }

func userOfToken(token string) (int, bool) {
	rest, ok := strings.CutPrefix(token, "ExponentPushToken[e2e-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSuffix(rest, "]"))
	return n, err == nil
}
