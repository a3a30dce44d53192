package check

import "testing"

func TestParseHelp(t *testing.T) {
	const help = `Usage: spoolcast relay --producer NAME [flags]

  --producer
        logical producing service that scopes idempotency keys, the same on every replica (required)
        default "", env SPOOLCAST_PRODUCER
  --shutdown-timeout
        how long a graceful shutdown waits
        default 15s, env SPOOLCAST_SHUTDOWN_TIMEOUT
`
	c, err := ParseHelp("relay", help)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Flags["producer"]; !f.Required || f.Env != "SPOOLCAST_PRODUCER" || f.Default != "" {
		t.Errorf("--producer: %+v", f)
	}
	if f := c.Envs["SPOOLCAST_SHUTDOWN_TIMEOUT"]; f.Name != "shutdown-timeout" || f.Default != "15s" || f.Required {
		t.Errorf("SPOOLCAST_SHUTDOWN_TIMEOUT: %+v", f)
	}
	if _, err := ParseHelp("relay", "Usage: spoolcast relay\n"); err == nil {
		t.Error("a help without flags parsed")
	}
}

func TestIsSpoolcastImage(t *testing.T) {
	for image, want := range map[string]bool{
		"spoolcast":                              true,
		"spoolcast:1.4.2":                        true,
		"registry.example.com/spoolcast:1.4.2":   true,
		"registry.example.com:5000/spoolcast":    true,
		"ghcr.io/acme/spoolcast@sha256:0123abcd": true,
		"billing:1.0.0":                          false,
		"registry.example.com/spoolcast-ui:1.0":  false,
		"registry.example.com:5000/other":        false,
	} {
		if got := IsSpoolcastImage(image); got != want {
			t.Errorf("IsSpoolcastImage(%q) = %v, want %v", image, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, "1GiB": 1 << 30, "10MB": 10e6, "200MiB": 200 << 20} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1.5GiB", "-1", "1Gi"} {
		if _, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q) took it", s)
		}
	}
}
