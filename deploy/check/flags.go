package check

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// Flag is one spoolcast flag as `spoolcast <command> --help` prints it.
type Flag struct {
	Name     string // without the dashes
	Env      string // the environment variable that sets it
	Default  string // as printed; "" when the default is empty
	Required bool   // the help says "(required)"
}

// Command is the flags of one spoolcast command.
type Command struct {
	Name  string
	Flags map[string]Flag // by name
	Envs  map[string]Flag // by environment variable
}

var (
	flagLine    = regexp.MustCompile(`^\s+--([a-z0-9][a-z0-9-]*)\s*$`)
	defaultLine = regexp.MustCompile(`^\s+default (.*), env ([A-Z0-9_]+)\s*$`)
)

// HelpFlags runs `bin command --help` and reads its flags. It fails when the
// help lists none, so that a change of the help's layout cannot make every
// flag look unknown, or every check pass.
func HelpFlags(bin, command string) (Command, error) {
	out, err := exec.Command(bin, command, "--help").CombinedOutput()
	if err != nil {
		return Command{}, fmt.Errorf("%s %s --help: %w\n%s", bin, command, err, out)
	}
	c, err := ParseHelp(command, string(out))
	if err != nil {
		return Command{}, fmt.Errorf("%s %s --help: %w", bin, command, err)
	}
	return c, nil
}

// ParseHelp reads the flags of one command from its help text: each flag on
// a line of its own ("  --spool"), then its description, then "default X,
// env SPOOLCAST_X".
func ParseHelp(command, help string) (Command, error) {
	c := Command{Name: command, Flags: map[string]Flag{}, Envs: map[string]Flag{}}
	var cur *Flag
	var desc strings.Builder
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			cur = &Flag{Name: m[1]}
			desc.Reset()
			continue
		}
		if cur == nil {
			continue
		}
		if m := defaultLine.FindStringSubmatch(line); m != nil {
			cur.Default, cur.Env = m[1], m[2]
			if cur.Default == `""` {
				cur.Default = ""
			}
			cur.Required = strings.Contains(desc.String(), "(required)")
			c.Flags[cur.Name], c.Envs[cur.Env] = *cur, *cur
			cur = nil
			continue
		}
		desc.WriteString(line)
	}
	if len(c.Flags) == 0 {
		return c, fmt.Errorf("no flags found in the help of %q", command)
	}
	return c, nil
}
