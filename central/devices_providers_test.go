package central_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/channel/channeltest"
)

func TestDevicesOfEveryProviderRegisterByTheirShapeAndShareOneCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{channels: channeltest.Start(t).Channels})
	alice := h.iss.Token("alice")
	apnsToken, fcmToken := strings.Repeat("9f", 32), "dK3:"+strings.Repeat("APA91b-x_", 16)
	for _, tc := range []struct {
		body   string
		status int
		field  string
	}{
		{`{"token":"` + apnsToken + `","platform":"ios","provider":"apns"}`, 200, ""},
		{`{"token":"` + fcmToken + `","platform":"android","provider":"fcm"}`, 200, ""},
		{`{"token":"ExponentPushToken[abc123]","platform":"ios","provider":"expo"}`, 200, ""},
		{`{"token":"ExponentPushToken[abc123]","platform":"ios","provider":"apns"}`, 400, "token"},
		{`{"token":"` + apnsToken + `","platform":"android","provider":"apns"}`, 400, "platform"},
		{`{"token":"abc","platform":"android","provider":"fcm"}`, 400, "token"},
		{`{"token":"` + fcmToken + `","platform":"android","provider":"hms"}`, 400, "provider"},
		{`{"token":"` + fcmToken + `","platform":"web","provider":"fcm"}`, 400, "provider"},
		{`{"token":"` + apnsToken + `","platform":"ios","provider":"webpush"}`, 400, "provider"},
	} {
		r := h.request(http.MethodPut, "/v1/devices", alice, tc.body)
		if r.status != tc.status || (tc.field != "" && r.body["field"] != tc.field) {
			t.Errorf("PUT /v1/devices %s = %d %v; want %d naming %q", tc.body, r.status, r.body, tc.status, tc.field)
		}
	}
	providers := map[string]string{}
	for _, d := range h.request(http.MethodGet, "/v1/devices", alice, "").body["data"].([]any) {
		dev := d.(map[string]any)
		providers[dev["token"].(string)] = dev["provider"].(string)
	}
	if providers[apnsToken] != "apns" || providers[fcmToken] != "fcm" || providers["ExponentPushToken[abc123]"] != "expo" || len(providers) != 3 {
		t.Errorf("alice's devices by provider: %v", providers)
	}
	// The cap (20) counts every provider: 18 more Expo tokens disable the
	// least recently seen, the APNs device first.
	for i := range 18 {
		if r := h.request(http.MethodPut, "/v1/devices", alice, `{"token":"ExponentPushToken[more`+strings.Repeat("x", i+1)+`]","platform":"ios"}`); r.status != 200 {
			t.Fatalf("register %d: %d %v", i, r.status, r.body)
		}
	}
	enabled := 0
	for _, d := range h.request(http.MethodGet, "/v1/devices", alice, "").body["data"].([]any) {
		dev := d.(map[string]any)
		if dev["enabled"] == true {
			enabled++
		} else if dev["token"] != apnsToken || dev["disabled_reason"] != "replaced" {
			t.Errorf("disabled %v; want only the APNs device, replaced", dev)
		}
	}
	if enabled != 20 {
		t.Errorf("enabled devices = %d, want the cap, 20", enabled)
	}
}

func TestAProviderNotSetUpIsNamedWhenADeviceRegisters(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	r := h.request(http.MethodPut, "/v1/devices", h.iss.Token("alice"), `{"token":"`+strings.Repeat("ab", 32)+`","platform":"ios","provider":"apns"}`)
	if r.status != 400 || r.body["field"] != "provider" || !strings.Contains(r.body["detail"].(string), `provider "apns" is not set up`) {
		t.Errorf("= %d %v", r.status, r.body)
	}
}

func TestAnAPNsTokenInUppercaseIsTheSameDeviceAsInLowercase(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{channels: channeltest.Start(t).Channels})
	alice := h.iss.Token("alice")
	upper, lower := strings.Repeat("9F", 32), strings.Repeat("9f", 32)
	r := h.request(http.MethodPut, "/v1/devices", alice, `{"token":"`+upper+`","platform":"ios","provider":"apns"}`)
	if r.status != 200 || r.body["token"] != lower {
		t.Fatalf("PUT in uppercase = %d %v; want 200 with the token in lowercase", r.status, r.body)
	}
	r = h.request(http.MethodPut, "/v1/devices", alice, `{"token":"`+lower+`","platform":"ios","provider":"apns"}`)
	if r.status != 200 || r.body["token"] != lower {
		t.Fatalf("PUT in lowercase = %d %v", r.status, r.body)
	}
	if devs := h.request(http.MethodGet, "/v1/devices", alice, "").body["data"].([]any); len(devs) != 1 {
		t.Fatalf("alice has %d devices, want one: %v", len(devs), devs)
	}
	if r := h.request(http.MethodDelete, "/v1/devices/"+upper, alice, ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE in uppercase = %d %v", r.status, r.body)
	}
	dev := h.request(http.MethodGet, "/v1/devices", alice, "").body["data"].([]any)[0].(map[string]any)
	if dev["enabled"] != false || dev["disabled_reason"] != "user_request" {
		t.Errorf("after DELETE in uppercase: %v; want disabled by its user", dev)
	}
}
