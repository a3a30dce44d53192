package fcmtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
)

// ServiceAccount is a Google service account: the key file the Firebase
// console hands out (Project settings → Service accounts), with a key of
// its own.
type ServiceAccount struct {
	ProjectID    string
	ClientEmail  string
	PrivateKeyID string // the kid of the grants it signs
	TokenURI     string // where its grants go
	Key          *rsa.PrivateKey
}

// NewServiceAccount generates an RSA key and names an account of
// projectID whose grants go to tokenURI.
func NewServiceAccount(projectID, tokenURI string) (*ServiceAccount, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	return newServiceAccount(projectID, tokenURI, key), nil
}

func newServiceAccount(projectID, tokenURI string, key *rsa.PrivateKey) *ServiceAccount {
	kid := make([]byte, 20)
	_, _ = rand.Read(kid) // never fails
	return &ServiceAccount{
		ProjectID:    projectID,
		ClientEmail:  "firebase-adminsdk-fake@" + projectID + ".iam.gserviceaccount.com",
		PrivateKeyID: hex.EncodeToString(kid),
		TokenURI:     tokenURI,
		Key:          key,
	}
}

// JSON is the account's key file, field for field as Google writes one
// (the key PKCS#8 in PEM).
func (sa *ServiceAccount) JSON() []byte {
	der, err := x509.MarshalPKCS8PrivateKey(sa.Key)
	if err != nil {
		panic(err) // an RSA key always marshals
	}
	b, _ := json.MarshalIndent(map[string]string{
		"type":                        "service_account",
		"project_id":                  sa.ProjectID,
		"private_key_id":              sa.PrivateKeyID,
		"private_key":                 string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":                sa.ClientEmail,
		"client_id":                   "100000000000000000000",
		"auth_uri":                    "https://accounts.google.com/o/oauth2/auth",
		"token_uri":                   sa.TokenURI,
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
		"client_x509_cert_url":        "https://www.googleapis.com/robot/v1/metadata/x509/" + sa.ClientEmail,
		"universe_domain":             "googleapis.com",
	}, "", "  ")
	return b
}

// WriteFile writes the key file to path, readable by its owner only.
func (sa *ServiceAccount) WriteFile(path string) error {
	if err := os.WriteFile(path, sa.JSON(), 0o600); err != nil {
		return fmt.Errorf("write service account: %w", err)
	}
	return nil
}
