package fcm

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// googleTokenURL is where a key file without token_uri sends its grants.
const googleTokenURL = "https://oauth2.googleapis.com/token"

// whereToGetOne ends every credentials error: what the flag wants.
const whereToGetOne = "want the service account key file from the Firebase console (Project settings → Service accounts → Generate new private key)"

// serviceAccount is what a Google service account key file says that
// sending needs.
type serviceAccount struct {
	Type         string `json:"type"`
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	TokenURI     string `json:"token_uri"`
}

// loadServiceAccount reads the key file (or its contents, when given
// them) and checks it says what sending needs, with errors that name the
// flag an operator sets.
func loadServiceAccount(file string, contents []byte, projectOverride string) (serviceAccount, error) {
	what := "--fcm-credentials-file"
	if file != "" {
		what = fmt.Sprintf("--fcm-credentials-file %s", file)
		b, err := os.ReadFile(file)
		if err != nil {
			return serviceAccount{}, fmt.Errorf("%s: %w", what, err)
		}
		contents = b
	}
	var sa serviceAccount
	if err := json.Unmarshal(contents, &sa); err != nil {
		return serviceAccount{}, fmt.Errorf("%s: not JSON (%v); %s", what, err, whereToGetOne)
	}
	if sa.Type != "service_account" {
		return serviceAccount{}, fmt.Errorf("%s: its type is %q, not \"service_account\"; %s", what, sa.Type, whereToGetOne)
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"project_id", sa.ProjectID + projectOverride}, // a ProjectID in Config stands in for it
		{"private_key_id", sa.PrivateKeyID},
		{"private_key", sa.PrivateKey},
		{"client_email", sa.ClientEmail},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if missing != nil {
		return serviceAccount{}, fmt.Errorf("%s: no %s; %s", what, strings.Join(missing, ", "), whereToGetOne)
	}
	if err := checkKey(sa.PrivateKey); err != nil {
		return serviceAccount{}, fmt.Errorf("%s: private_key: %w; %s", what, err, whereToGetOne)
	}
	if sa.TokenURI == "" {
		sa.TokenURI = googleTokenURL
	}
	if projectOverride != "" {
		sa.ProjectID = projectOverride
	}
	return sa, nil
}

// checkKey checks the key parses as golang.org/x/oauth2/jwt will parse it
// at each grant, so that a bad key stops the start, not every send.
func checkKey(key string) error {
	block, _ := pem.Decode([]byte(key))
	if block == nil {
		return errors.New("not a PEM block")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		if parsed, err = x509.ParsePKCS1PrivateKey(block.Bytes); err != nil {
			return fmt.Errorf("neither a PKCS#8 nor a PKCS#1 key: %w", err)
		}
	}
	if _, ok := parsed.(*rsa.PrivateKey); !ok {
		return fmt.Errorf("a %T, not an RSA key", parsed)
	}
	return nil
}
