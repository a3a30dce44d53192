package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/configuration.md from the flag sets")

// configurationDoc is docs/configuration.md: every command's flags with
// their environment variables and defaults, from the flag sets themselves.
func configurationDoc() string {
	var b bytes.Buffer
	b.WriteString("# Configuration\n\n")
	b.WriteString("Every flag of every `spoolcast` command, generated from the flag sets (`go test ./cmd/spoolcast -run Configuration -update`\n")
	b.WriteString("rewrites this file; a test fails when it is out of date). Each flag also reads the environment variable beside it;\n")
	b.WriteString("a flag on the command line wins. [operations.md](operations.md) explains how to choose the values.\n")
	for _, c := range commands() {
		fs, _ := c.flags()
		fmt.Fprintf(&b, "\n## `spoolcast %s`\n\n%s.\n\n", c.name, strings.ToUpper(c.summary[:1])+c.summary[1:])
		b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
		fs.VisitAll(func(f *flag.Flag) {
			def := "`" + f.DefValue + "`"
			if f.DefValue == "" {
				def = "none"
			}
			usage := strings.ReplaceAll(f.Usage, "|", `\|`)
			fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s |\n", f.Name, envName(f.Name), def, usage)
		})
	}
	return b.String()
}

func TestConfigurationDocListsEveryFlag(t *testing.T) {
	const path = "../../docs/configuration.md"
	want := configurationDoc()
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/configuration.md is out of date with the flags: run go test ./cmd/spoolcast -run Configuration -update")
	}
}

// TestOperationsFlagTablesMatchTheFlags checks the hand-written flag tables of
// docs/operations.md: each row names a flag of the command its section is
// about, with that flag's environment variable and default.
func TestOperationsFlagTablesMatchTheFlags(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string]*flag.FlagSet{}
	for _, c := range commands() {
		sets[c.name], _ = c.flags()
	}
	var fs *flag.FlagSet
	var section string
	rows := 0
	for line := range strings.SplitSeq(string(raw), "\n") {
		if name, ok := strings.CutPrefix(line, "## `spoolcast "); ok {
			section = strings.TrimSuffix(name, "`")
			fs = sets[section]
			continue
		}
		if !strings.HasPrefix(line, "| `--") || fs == nil {
			continue
		}
		cells := strings.Split(line, "|")[1:]
		if len(cells) < 3 {
			continue
		}
		names, envs, defs := codeSpans(cells[0]), codeSpans(cells[1]), codeSpans(cells[2])
		for i, name := range names {
			name = strings.TrimPrefix(name, "--")
			f := fs.Lookup(name)
			if f == nil {
				t.Errorf("operations.md, spoolcast %s: --%s is not a flag of the command", section, name)
				continue
			}
			rows++
			if i < len(envs) && envs[i] != envName(name) {
				t.Errorf("operations.md, spoolcast %s --%s: environment %s, want %s", section, name, envs[i], envName(name))
			}
			if i < len(defs) && !sameDefault(defs[i], f.DefValue) {
				t.Errorf("operations.md, spoolcast %s --%s: default %q, the flag's is %q", section, name, defs[i], f.DefValue)
			}
		}
	}
	if rows < 40 {
		t.Errorf("only %d flag rows found in operations.md: did its tables change shape?", rows)
	}
}

// codeSpans returns the `code` spans of a table cell.
func codeSpans(cell string) []string {
	parts := strings.Split(cell, "`")
	var out []string
	for i := 1; i < len(parts); i += 2 {
		out = append(out, parts[i])
	}
	return out
}

// sameDefault compares a documented default with a flag's: "(required)",
// "none" and the like stand for an empty default; durations compare by value.
func sameDefault(doc, def string) bool {
	if doc == def || def == "" || def == "0s" || def == "0" || def == "false" {
		return true // an empty default is documented in words ("none", "(required)", "--database-url")
	}
	if a, err := time.ParseDuration(doc); err == nil {
		b, err := time.ParseDuration(def)
		return err == nil && a == b
	}
	return false
}
