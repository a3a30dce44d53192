package apns

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

func TestNewNamesTheFlagToFix(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "AuthKey_KEY1234567.p8")
	if err := apnstest.WriteP8(good, apnstest.NewKey()); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "notpem.p8")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	p384 := filepath.Join(dir, "p384.p8")
	key384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key384)
	if err := os.WriteFile(p384, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}

	valid := Config{KeyFile: good, KeyID: testKeyID, TeamID: testTeamID, Topic: testTopic}
	cases := []struct {
		name string
		edit func(*Config)
		want string // in the error; "" for none
	}{
		{"a .p8 file, ids and topic", func(*Config) {}, ""},
		{"no key", func(c *Config) { c.KeyFile = "" }, "--apns-key-file is required"},
		{"a key file not found", func(c *Config) { c.KeyFile = filepath.Join(dir, "missing.p8") }, "--apns-key-file"},
		{"a key file not PEM", func(c *Config) { c.KeyFile = notPEM }, "--apns-key-file"},
		{"a key not on P-256", func(c *Config) { c.KeyFile = p384 }, "--apns-key-file"},
		{"a key id of 9 characters", func(c *Config) { c.KeyID = "KEY123456" }, "--apns-key-id"},
		{"a key id with a space", func(c *Config) { c.KeyID = "KEY123456 " }, "--apns-key-id"},
		{"no team id", func(c *Config) { c.TeamID = "" }, "--apns-team-id"},
		{"no topic", func(c *Config) { c.Topic = "" }, "--apns-topic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := valid
			c.edit(&cfg)
			ch, err := New(cfg)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("New: %v, want a channel", err)
			case c.want == "":
				_ = ch.Close()
			case err == nil || !strings.Contains(err.Error(), c.want):
				t.Errorf("New: %v, want an error naming %s", err, c.want)
			}
		})
	}
}

func TestValidTokenTakesHexOf32To100Bytes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		token string
		want  bool
	}{
		{strings.Repeat("ab", 32), true},             // 32 bytes, today's tokens
		{strings.Repeat("AB", 32), true},             // upper case hex
		{strings.Repeat("0f", 100), true},            // 100 bytes: room to grow
		{strings.Repeat("0f", 101), false},           // longer
		{strings.Repeat("ab", 31), false},            // shorter
		{strings.Repeat("ab", 32) + "a", false},      // half a byte
		{strings.Repeat("zz", 32), false},            // not hex
		{strings.Repeat("ab", 31) + "a/", false},     // a path
		{"ExponentPushToken[xxxxxxxxxxxxxx]", false}, // another provider's
		{"", false},
	}
	for _, c := range cases {
		if got := ValidToken(c.token); got != c.want {
			t.Errorf("ValidToken(%q) = %v, want %v", c.token, got, c.want)
		}
	}
}
