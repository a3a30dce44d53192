package central_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/channel/webpush"
)

// testVAPIDPublicKey stands for a deployment's key where only its presence matters.
const testVAPIDPublicKey = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"

const browserKeys = `"keys":{"p256dh":"BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM","auth":"tBHItJI5svbpez7KI4CCXg"}`

func TestBrowsersRegisterTheirSubscriptionsAsWebDevices(t *testing.T) {
	t.Parallel()
	pem, _ := webpush.GenerateVAPIDKeyPEM()
	key, err := webpush.LoadVAPIDKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, options{vapidPublicKey: key.PublicKey()})
	alice := h.iss.Token("alice")
	if r := h.request(http.MethodGet, "/v1/push/vapid-public-key", alice, ""); r.status != http.StatusOK || r.body["key"] != key.PublicKey() {
		t.Errorf("vapid public key = %d %s", r.status, r.raw)
	}
	// A public endpoint that does not resolve here is refused like a
	// private one would be: central cannot tell it is public.
	put := func(body string) response { return h.request(http.MethodPut, "/v1/devices", alice, body) }
	for _, c := range []struct{ body, field string }{
		{`{"platform":"web","subscription":{"endpoint":"https://127.0.0.1/push/1",` + browserKeys + `}}`, "subscription"},
		{`{"platform":"web","subscription":{"endpoint":"https://10.0.0.8/push/1",` + browserKeys + `}}`, "subscription"},
		{`{"platform":"web","subscription":{"endpoint":"http://push.example.com/1",` + browserKeys + `}}`, "subscription"},
		{`{"platform":"web","subscription":{"endpoint":"https://push.example.com/1","keys":{"p256dh":"AAAA","auth":"tBHItJI5svbpez7KI4CCXg"}}}`, "subscription"},
		{`{"platform":"web"}`, "subscription"},
		{`{"platform":"web","token":"ExponentPushToken[x]","subscription":{}}`, "token"},
		{`{"platform":"ios","token":"ExponentPushToken[x]","subscription":{"endpoint":"https://push.example.com/1"}}`, "subscription"},
		{`{"platform":"windows","token":"ExponentPushToken[x]"}`, "platform"},
	} {
		if r := put(c.body); r.status != http.StatusBadRequest || r.body["field"] != c.field {
			t.Errorf("%s = %d %s; want 400 on %s", c.body, r.status, r.raw, c.field)
		}
	}
}

func TestAWebDeviceIsListedAndDisabledByItsToken(t *testing.T) {
	t.Parallel()
	sub := `{"platform":"web","subscription":{"endpoint":"http://127.0.0.1:9/push/abc","expirationTime":null,` + browserKeys + `}}`
	bare := newHarness(t, options{webPushAllowPrivate: true})
	if r := bare.request(http.MethodGet, "/v1/push/vapid-public-key", bare.iss.Token("alice"), ""); r.status != http.StatusNotFound {
		t.Errorf("vapid public key without --vapid-key-file = %d", r.status)
	}
	if r := bare.request(http.MethodPut, "/v1/devices", bare.iss.Token("alice"), sub); r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), "not set up") {
		t.Errorf("register a browser without --vapid-key-file = %d %s, want 400", r.status, r.raw)
	}

	h := newHarness(t, options{webPushAllowPrivate: true, vapidPublicKey: testVAPIDPublicKey})
	alice := h.iss.Token("alice")
	r := h.request(http.MethodPut, "/v1/devices", alice, sub)
	token, _ := r.body["token"].(string)
	if r.status != http.StatusOK || r.body["platform"] != "web" || !strings.HasPrefix(token, "WebPush[") || strings.Contains(string(r.raw), "127.0.0.1") {
		t.Fatalf("register a browser = %d %s", r.status, r.raw)
	}
	if again := h.request(http.MethodPut, "/v1/devices", alice, sub); again.body["token"] != token {
		t.Errorf("the same subscription again = %s, want the same device", again.raw)
	}
	list := h.request(http.MethodGet, "/v1/devices", alice, "")
	if list.status != http.StatusOK || len(list.body["data"].([]any)) != 1 {
		t.Errorf("list = %d %s", list.status, list.raw)
	}
	if del := h.request(http.MethodDelete, "/v1/devices/"+token, alice, ""); del.status != http.StatusNoContent {
		t.Errorf("delete %s = %d %s", token, del.status, del.raw)
	}
}
