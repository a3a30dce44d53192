package fcm_test

import (
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sharedKey is the key of every fake's service account: one RSA key
// generated, rather than one a test.
var sharedKey = sync.OnceValue(func() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
})

// startFake starts a fake FCM and token endpoint, closed when t ends.
func startFake(t *testing.T, cfg fcmtest.Config) *fcmtest.Server {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = sharedKey()
	}
	fake, err := fcmtest.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	return fake
}

// credentials writes fake's service account key file and returns its path.
func credentials(t *testing.T, fake *fcmtest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "service-account.json")
	if err := fake.WriteCredentials(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// newChannel returns a channel to fake, with cfg's other fields; closed
// when t ends, before fake is.
func newChannel(t *testing.T, fake *fcmtest.Server, cfg fcm.Config) *fcm.Channel {
	t.Helper()
	if cfg.CredentialsFile == "" && cfg.Credentials == nil {
		cfg.CredentialsFile = credentials(t, fake)
	}
	cfg.Endpoint = fake.URL()
	ch, err := fcm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// setup is a fake with default faults and a channel to it.
func setup(t *testing.T) (*fcmtest.Server, *fcm.Channel) {
	t.Helper()
	fake := startFake(t, fcmtest.Config{})
	return fake, newChannel(t, fake, fcm.Config{})
}

// token is the i'th device's registration token, shaped as FCM's are.
func token(i int) string {
	return fmt.Sprintf("eXampleDeviceId%03d:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8OvPVGJ", i)
}

func msg(i int) channel.Message {
	return channel.Message{Token: token(i), ID: fmt.Sprintf("n%d", i), Title: "Hello", Body: "A new reply"}
}

func msgs(n int) []channel.Message {
	out := make([]channel.Message, n)
	for i := range out {
		out[i] = msg(i)
	}
	return out
}

// kinds lists the outcomes' kinds.
func kinds(out []channel.Outcome) []channel.Kind {
	ks := make([]channel.Kind, len(out))
	for i, o := range out {
		ks[i] = o.Kind
	}
	return ks
}

// count is how many outcomes are of kind k.
func count(out []channel.Outcome, k channel.Kind) int {
	n := 0
	for _, o := range out {
		if o.Kind == k {
			n++
		}
	}
	return n
}

// byToken is fake's messages keyed by token.
func byToken(fake *fcmtest.Server) map[string]fcmtest.Message {
	m := map[string]fcmtest.Message{}
	for _, got := range fake.Messages() {
		m[got.Token] = got
	}
	return m
}
