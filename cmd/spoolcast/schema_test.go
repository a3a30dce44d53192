package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/testsignal"
)

// A central started before its migration has run is not ready, and says
// why, until the migration has run: a rollout does not send traffic to code
// whose schema is not there yet.
func TestCentralIsNotReadyUntilItsSchemaIsMigrated(t *testing.T) {
	dbURL := pgtest.EmptyDB(t)
	base, _ := startCentralProcess(t, dbURL)
	readyz := func() (int, string) { return readyz(t, base) }
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "the schema is at migration 0") || !strings.Contains(body, "run spoolcast migrate up") {
		t.Fatalf("/readyz before the migration = %d %s; want 503 saying to migrate", code, body)
	}

	var out bytes.Buffer
	if code := run([]string{"migrate", "up", "--database-url", dbURL}, &out, &out); code != 0 {
		t.Fatalf("migrate up exited %d: %s", code, out.String())
	}
	testsignal.Eventually(t, "/readyz to answer 200 after the migration", 30*time.Second, func() bool {
		code, _ := readyz()
		return code == http.StatusOK
	})
}
