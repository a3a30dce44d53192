package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/webhook"
)

func TestWebhookListenPrintsWhatVerifiesAndRefusesTheRest(t *testing.T) {
	secret := webhook.NewSecret()
	var out bytes.Buffer
	h := webhookPrinter(secret, &out)
	body := `{"type":"notification.created","timestamp":"2026-12-01T19:00:00Z","data":{}}`
	send := func(secret, ts string) int {
		n, _ := strconv.ParseInt(ts, 10, 64)
		sig, _ := webhook.Sign([]string{secret}, "d-1", n, []byte(body))
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set("webhook-id", "d-1")
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", sig)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	now := strconv.FormatInt(time.Now().Unix(), 10)
	if code := send(secret, now); code != http.StatusNoContent || !strings.Contains(out.String(), "verified webhook-id=d-1 "+body) {
		t.Errorf("a signed delivery = %d, printed %q", code, out.String())
	}
	out.Reset()
	if code := send(webhook.NewSecret(), now); code != http.StatusUnauthorized || !strings.Contains(out.String(), "refused webhook-id=d-1") {
		t.Errorf("another secret's = %d, printed %q", code, out.String())
	}
	if code := send(secret, strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)); code != http.StatusUnauthorized {
		t.Errorf("an hour-old timestamp = %d", code)
	}
}
