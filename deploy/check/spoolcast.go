package check

import (
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// CLI is what the spoolcast binary says of itself: its commands, each
// one's subcommands (`migrate up|status`) and flags.
type CLI struct {
	Commands    map[string]Command
	Subcommands map[string][]string // only for commands that need one
}

var (
	commandLine = regexp.MustCompile(`^  ([a-z]+)\s{2,}\S`)
	usageSubs   = regexp.MustCompile(`spoolcast ([a-z]+) ([a-z]+(?:\|[a-z]+)+)\b`)
)

// ReadCLI asks bin for its commands (`spoolcast --help`) and each one's flags.
func ReadCLI(bin string) (*CLI, error) {
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --help: %w\n%s", bin, err, out)
	}
	cli := &CLI{Commands: map[string]Command{}, Subcommands: map[string][]string{}}
	inCommands := false
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "Commands:"):
			inCommands = true
		case strings.TrimSpace(line) == "":
			inCommands = false
		case inCommands:
			if m := commandLine.FindStringSubmatch(line); m != nil {
				c, err := HelpFlags(bin, m[1])
				if err != nil {
					return nil, err
				}
				cli.Commands[m[1]] = c
			}
		}
	}
	if len(cli.Commands) == 0 {
		return nil, fmt.Errorf("%s --help lists no commands", bin)
	}
	for name := range cli.Commands {
		out, _ := exec.Command(bin, name, "--help").CombinedOutput()
		if m := usageSubs.FindStringSubmatch(string(out)); m != nil && m[1] == name {
			cli.Subcommands[name] = strings.Split(m[2], "|")
		}
	}
	return cli, nil
}

// IsSpoolcastImage reports whether image is spoolcast's, whatever its
// registry, tag or digest: registry.example.com/spoolcast:1.4.2 is.
func IsSpoolcastImage(image string) bool {
	name, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name[strings.LastIndex(name, "/")+1:] == "spoolcast"
}

// Invocation is one container running spoolcast: its command and where
// each of its settings comes from.
type Invocation struct {
	Container corev1.Container
	Command   Command
	Args      []string // after the command (and subcommand)
}

// Setting is a flag's value in a container: from an argument, from its
// environment variable, or the default.
type Setting struct {
	Value  string               // the literal value; "" when it comes from ValueFrom
	From   *corev1.EnvVarSource // a Secret, a ConfigMap, a field
	Set    bool                 // given by an argument or the environment
	Source string               // "--flag", "env NAME" or "default"
}

// Get returns the setting of flag (without dashes); an unknown flag panics,
// since the checks only ask for flags they know.
func (in Invocation) Get(flag string) Setting {
	f, ok := in.Command.Flags[flag]
	if !ok {
		panic(fmt.Sprintf("spoolcast %s has no flag --%s", in.Command.Name, flag))
	}
	for i, a := range in.Args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != flag {
			continue
		}
		if !hasValue && i+1 < len(in.Args) {
			value = in.Args[i+1]
		}
		return Setting{Value: value, Set: true, Source: "--" + flag}
	}
	for _, e := range in.Container.Env {
		if e.Name == f.Env {
			return Setting{Value: e.Value, From: e.ValueFrom, Set: true, Source: "env " + e.Name}
		}
	}
	return Setting{Value: f.Default, Source: "default"}
}

// Env returns the literal value of a non-spoolcast variable (GOMEMLIMIT).
func (in Invocation) Env(name string) (string, bool) {
	for _, e := range in.Container.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// Invoke reads how c runs spoolcast and checks it against the CLI: a
// command that exists (with its subcommand), flags in its arguments and
// SPOOLCAST_ variables in its environment that the command has, no variable
// given twice, every required flag set.
func (cli *CLI) Invoke(c corev1.Container) (Invocation, []error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(c.Command) > 0 {
		fail("container %s sets command %q: the image's entrypoint is spoolcast; give the subcommand in args", c.Name, c.Command)
	}
	if len(c.Args) == 0 {
		fail("container %s has no args: which spoolcast command should it run?", c.Name)
		return Invocation{Container: c}, errs
	}
	cmd, ok := cli.Commands[c.Args[0]]
	if !ok {
		fail("container %s runs `spoolcast %s`: no such command", c.Name, c.Args[0])
		return Invocation{Container: c}, errs
	}
	in := Invocation{Container: c, Command: cmd, Args: c.Args[1:]}
	if subs := cli.Subcommands[cmd.Name]; subs != nil {
		if len(in.Args) == 0 || !slices.Contains(subs, in.Args[0]) {
			fail("container %s runs `spoolcast %s` without one of its subcommands %v", c.Name, cmd.Name, subs)
		} else {
			in.Args = in.Args[1:]
		}
	}
	for _, a := range in.Args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := cmd.Flags[name]; !ok {
			fail("container %s passes %s: `spoolcast %s` has no flag --%s", c.Name, a, cmd.Name, name)
		}
	}
	seen := map[string]bool{}
	for _, e := range c.Env {
		if seen[e.Name] {
			fail("container %s sets %s twice", c.Name, e.Name)
		}
		seen[e.Name] = true
		_, ok := cmd.Envs[e.Name]
		switch {
		case strings.HasPrefix(e.Name, "SPOOLCAST_") && !ok:
			fail("container %s sets %s: `spoolcast %s` reads no such variable", c.Name, e.Name, cmd.Name)
		case strings.HasPrefix(e.Name, "SPOOL") && !strings.HasPrefix(e.Name, "SPOOLCAST_"):
			fail("container %s sets %s: spoolcast's variables start with SPOOLCAST_", c.Name, e.Name)
		case strings.HasPrefix(e.Name, "GO") && !goRuntimeEnv[e.Name]:
			fail("container %s sets %s: not a variable the Go runtime reads (%s)", c.Name, e.Name, strings.Join(slices.Sorted(maps.Keys(goRuntimeEnv)), ", "))
		case e.Value != "" && e.ValueFrom != nil:
			fail("container %s sets %s both as a value and from a source: the API server refuses it", c.Name, e.Name)
		}
	}
	for _, from := range c.EnvFrom {
		// Names from a ConfigMap or Secret are not in the manifests: they
		// escape every check above.
		fail("container %s takes variables with envFrom (%s): list each spoolcast variable under env, where it is checked", c.Name, envFromName(from))
	}
	for _, f := range cmd.Flags {
		if f.Required && !in.Get(f.Name).Set {
			fail("container %s runs `spoolcast %s` without its required --%s (or %s)", c.Name, cmd.Name, f.Name, f.Env)
		}
	}
	return in, errs
}

// goRuntimeEnv are the variables a Go program's runtime reads.
var goRuntimeEnv = map[string]bool{"GOMEMLIMIT": true, "GOGC": true, "GOMAXPROCS": true, "GODEBUG": true, "GOTRACEBACK": true}

func envFromName(from corev1.EnvFromSource) string {
	switch {
	case from.ConfigMapRef != nil:
		return "ConfigMap " + from.ConfigMapRef.Name
	case from.SecretRef != nil:
		return "Secret " + from.SecretRef.Name
	}
	return "a source"
}
