package check

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// ruleFile is the part of a Prometheus rule file these tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// ruleTests is the part of a promtool rules test file these tests read.
type ruleTests struct {
	Tests []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestEveryAlertIsTested: promtool runs rules_test.yaml; this makes sure it
// shows every alert of rules.yaml both firing and silent, so that a new
// alert cannot land untested.
func TestEveryAlertIsTested(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "deploy", "prometheus")
	var rules ruleFile
	var tests ruleTests
	readYAML(t, filepath.Join(dir, "rules.yaml"), &rules)
	readYAML(t, filepath.Join(dir, "rules_test.yaml"), &tests)
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] {
				t.Errorf("rules_test.yaml never shows %s firing", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("rules_test.yaml never shows %s silent", r.Alert)
			}
		}
	}
	if n == 0 {
		t.Fatal("rules.yaml has no alerts")
	}
}
