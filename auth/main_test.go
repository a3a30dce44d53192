package auth_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The JWKS refresh runs in the background; every test must stop it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
