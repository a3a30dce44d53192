package apns

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
)

// sentPayload is the payload the fake received for a message, decoded.
type sentPayload struct {
	APS struct {
		Alert struct{ Title, Body string }
		Sound string
	}
	ID       string
	Category string
	Digest   []string
}

func decode(t *testing.T, raw []byte) sentPayload {
	t.Helper()
	var p sentPayload
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("payload %s: %v", raw, err)
	}
	return p
}

func TestARequestCarriesTheNotificationsHeadersAndPayload(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := newRig(t, func(c *Config) { c.Clock = clock.Frozen(now) })
	urgent := message(0)
	urgent.Urgent = true
	urgent.Expires = now.Add(time.Hour)
	urgent.Category = "mention"
	urgent.Data = map[string]any{"digest": []string{"a", "b"}, "id": "not mine", "aps": "not mine"}
	digest := message(1)
	digest.CollapseKey = "digest-2026-03-01"

	for i, o := range r.send(t, urgent, digest) {
		if o.Kind != channel.Delivered {
			t.Fatalf("message %d: %+v, want delivered", i, o)
		}
	}
	seen := byToken(r.fake.Requests())
	cases := []struct {
		msg                            channel.Message
		collapse, priority, expiration string
	}{
		{urgent, "ntf-0", "10", strconv.FormatInt(now.Add(time.Hour).Unix(), 10)},
		{digest, "digest-2026-03-01", "5", strconv.FormatInt(now.Add(24*time.Hour).Unix(), 10)},
	}
	for _, c := range cases {
		h := seen[c.msg.Token].Header
		for name, want := range map[string]string{
			"apns-collapse-id": c.collapse,
			"apns-push-type":   "alert",
			"apns-priority":    c.priority,
			"apns-expiration":  c.expiration,
			"apns-topic":       testTopic,
		} {
			if got := h.Get(name); got != want {
				t.Errorf("%s: %s %q, want %q", c.msg.ID, name, got, want)
			}
		}
	}

	p := decode(t, seen[urgent.Token].Payload)
	if p.APS.Alert.Title != urgent.Title || p.APS.Alert.Body != urgent.Body || p.APS.Sound != "default" {
		t.Errorf("aps %+v, want the title, the body and the default sound", p.APS)
	}
	if p.ID != "ntf-0" || p.Category != "mention" || strings.Join(p.Digest, ",") != "a,b" {
		t.Errorf("payload %s, want id ntf-0, category mention and the digest (data cannot replace id or aps)", seen[urgent.Token].Payload)
	}
}

func TestACollapseKeyOver64BytesIsSentAsItsHash(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	m := message(0)
	m.CollapseKey = strings.Repeat("digest:", 20)
	sum := sha256.Sum256([]byte(m.CollapseKey))
	want := hex.EncodeToString(sum[:])

	for range 2 {
		if o := r.send(t, m)[0]; o.Kind != channel.Delivered {
			t.Fatalf("outcome %+v, want delivered (APNs refuses a collapse id over 64 bytes)", o)
		}
	}
	for i, req := range r.fake.Requests() {
		if got := req.Header.Get("apns-collapse-id"); got != want {
			t.Errorf("send %d: apns-collapse-id %q, want the same SHA-256 each time, %q", i, got, want)
		}
	}
}

func TestALongBodyIsCutToFitAndKeepsTheID(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	long := message(0)
	long.Body = strings.Repeat("é<&", 2000) // JSON escapes < and & as 6 bytes each
	long.Data = map[string]any{"digest": []string{"x"}}
	longTitle := message(1)
	longTitle.Title = strings.Repeat("título ", 1000)

	for i, o := range r.send(t, long, longTitle) {
		if o.Kind != channel.Delivered {
			t.Fatalf("message %d: %+v, want delivered", i, o)
		}
	}
	seen := byToken(r.fake.Requests())

	raw := seen[long.Token].Payload
	p := decode(t, raw)
	cut, ok := strings.CutSuffix(p.APS.Alert.Body, "…")
	if len(raw) > maxPayload || len(raw) < maxPayload-12 || !ok || !strings.HasPrefix(long.Body, cut) || !utf8.ValidString(cut) {
		t.Errorf("payload of %d bytes, body %q...; want just under 4096 bytes, a prefix of the body on a rune boundary, then …",
			len(raw), p.APS.Alert.Body[:20])
	}
	if p.ID != long.ID || p.APS.Alert.Title != long.Title || len(p.Digest) != 1 {
		t.Errorf("id %q, title %q, digest %v; want them whole", p.ID, p.APS.Alert.Title, p.Digest)
	}

	raw = seen[longTitle.Token].Payload
	p = decode(t, raw)
	if cut, ok := strings.CutSuffix(p.APS.Alert.Title, "…"); len(raw) > maxPayload || !ok || !strings.HasPrefix(longTitle.Title, cut) || p.ID != longTitle.ID {
		t.Errorf("payload of %d bytes, id %q; want the title cut under 4096 bytes, the id whole", len(raw), p.ID)
	}
}

func TestASilentMessageIsABackgroundPushWithItsDataAlone(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	clear := message(0)
	clear.Silent, clear.Urgent = true, true // urgency does not make a background push high priority
	clear.Title, clear.Body, clear.ID = "", "", ""
	clear.Data = map[string]any{"type": "clear", "ids": []string{"n1", "n2"}}
	if o := r.send(t, clear)[0]; o.Kind != channel.Delivered {
		t.Fatalf("%+v, want delivered (APNs refuses a background push at priority 10)", o)
	}
	req := byToken(r.fake.Requests())[clear.Token]
	for name, want := range map[string]string{"apns-push-type": "background", "apns-priority": "5", "apns-collapse-id": ""} {
		if got := req.Header.Get(name); got != want {
			t.Errorf("%s %q, want %q", name, got, want)
		}
	}
	var p struct {
		APS  map[string]any `json:"aps"`
		Type string
		IDs  []string
	}
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.APS) != 1 || p.APS["content-available"] != float64(1) || p.Type != "clear" || strings.Join(p.IDs, ",") != "n1,n2" {
		t.Errorf("payload %s, want aps with content-available alone, and the data", req.Payload)
	}
}
