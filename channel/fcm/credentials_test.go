package fcm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

func TestAKeyFileThatCannotSendIsRefusedNamingTheFlag(t *testing.T) {
	t.Parallel()
	acct := &fcmtest.ServiceAccount{ProjectID: "p1", ClientEmail: "sender@p1.iam.gserviceaccount.com",
		PrivateKeyID: "k1", TokenURI: "https://oauth2.example/token", Key: sharedKey()}
	// edit is acct's key file with f applied to its fields.
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(acct.JSON(), &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER}))
	garbagePEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a key")}))
	dir := t.TempDir()

	for _, tc := range []struct {
		name     string
		file     string // written to a file when set to "contents"
		contents []byte
		want     string
	}{
		{"a file that is not there", filepath.Join(dir, "missing.json"), nil, "no such file"},
		{"a file that is not JSON", "contents", []byte("project_id: p1"), "not JSON"},
		{"a user's credentials, not a service account's", "contents",
			[]byte(`{"type":"authorized_user","client_id":"x","refresh_token":"y"}`), `its type is "authorized_user", not "service_account"`},
		{"no email and no key", "contents",
			edit(func(m map[string]any) { delete(m, "client_email"); delete(m, "private_key") }), "no private_key, client_email"},
		{"a key that is not PEM", "contents",
			edit(func(m map[string]any) { m["private_key"] = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" }), "private_key: not a PEM block"},
		{"PEM that is not a key", "contents",
			edit(func(m map[string]any) { m["private_key"] = garbagePEM }), "private_key: neither a PKCS#8 nor a PKCS#1 key"},
		{"an EC key", "contents",
			edit(func(m map[string]any) { m["private_key"] = ecPEM }), "not an RSA key"},
		{"neither a file nor its contents", "", nil, "set --fcm-credentials-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := tc.file
			if path == "contents" {
				path = filepath.Join(t.TempDir(), "sa.json")
				if err := os.WriteFile(path, tc.contents, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_, err := fcm.New(fcm.Config{CredentialsFile: path})
			if err == nil {
				t.Fatal("New took it")
			}
			if msg := err.Error(); !strings.Contains(msg, "--fcm-credentials-file") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q, want one naming --fcm-credentials-file that says %q", msg, tc.want)
			}
		})
	}
}

func TestAKeyFileWithoutAProjectTakesConfigsProject(t *testing.T) {
	t.Parallel()
	acct := &fcmtest.ServiceAccount{ProjectID: "p1", ClientEmail: "sender@p1.iam.gserviceaccount.com",
		PrivateKeyID: "k1", TokenURI: "https://oauth2.example/token", Key: sharedKey()}
	noProject := strings.Replace(string(acct.JSON()), `"project_id": "p1"`, `"project_id": ""`, 1)
	if _, err := fcm.New(fcm.Config{Credentials: []byte(noProject)}); err == nil || !strings.Contains(err.Error(), "no project_id") {
		t.Errorf("without a project anywhere: %v, want no project_id", err)
	}
	ch, err := fcm.New(fcm.Config{Credentials: []byte(noProject), ProjectID: "p2"})
	if err != nil {
		t.Fatalf("with Config's project: %v", err)
	}
	ch.Close()
}

func TestAConfigThatCannotWorkIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  fcm.Config
		want string
	}{
		{fcm.Config{CredentialsFile: "a.json", Credentials: []byte("{}")}, "not both"},
		{fcm.Config{CredentialsFile: "a.json", Concurrency: -1}, "concurrency is negative"},
		{fcm.Config{CredentialsFile: "a.json", Endpoint: "fcm.googleapis.com"}, `endpoint "fcm.googleapis.com"`},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
