// Command spoolcast is the notification pipeline's one binary: the relay
// sidecar, the central deployment and their tools, as subcommands.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
)

// runFunc runs a subcommand once its flags are parsed. args are the words
// between the subcommand and its first flag (`spool stats --spool X`).
type runFunc func(ctx context.Context, args []string) error

// command is one subcommand. flags builds its flag set and the function that
// runs with the values parsed into it.
type command struct {
	name    string
	summary string
	flags   func() (*flag.FlagSet, runFunc)
}

func commands() []command {
	return []command{
		{"dev", "run the whole pipeline locally (Postgres, relay, central); `dev token` mints tokens for it", devCommand},
		{"relay", "run the producer-facing sidecar: spool events durably and forward them", relayCommand},
		{"central", "run the central API: authenticated feed, read state, live stream, push, internal ingress", centralCommand},
		{"migrate", "apply or list the Postgres schema migrations: `migrate up` or `migrate status`", migrateCommand},
		{"maintain", "run one maintenance pass: partitions ahead, drops past retention, expired keys", maintainCommand},
		{"emit", "post one sample event to a relay and print the answer", emitCommand},
		{"stream", "follow a user's live stream from central and print each frame", streamCommand},
		{"webhook", "receive webhooks, verifying each signature, and print them: `webhook listen`", webhookCommand},
		{"topics", "show topic fan-outs and their progress: `topics status`", topicsCommand},
		{"spool", "inspect a spool file (`spool stats`, `spool ls`) or requeue its dead rows (`spool requeue --dead`)", spoolCommand},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, version())
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		fs, runFn := c.flags()
		words, flagArgs := leadingWords(args[1:])
		// Help asked for goes to stdout (`spoolcast relay --help | less`);
		// the usage after a mistake goes to stderr.
		fs.SetOutput(stderr)
		if slices.ContainsFunc(flagArgs, func(a string) bool { return a == "-h" || a == "--help" || a == "-help" || a == "--h" }) {
			fs.SetOutput(stdout)
		}
		if err := parseFlags(fs, flagArgs); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintf(stderr, "spoolcast %s: %v\n", c.name, err)
			return 2
		}
		ctx, stop := signalContext(stderr)
		defer stop()
		if err := runFn(ctx, words); err != nil {
			fmt.Fprintf(stderr, "spoolcast %s: %v\n", c.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "spoolcast: unknown command %q; run spoolcast --help\n", args[0])
	return 2
}

func leadingWords(args []string) (words, rest []string) {
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		words, args = append(words, args[0]), args[1:]
	}
	return words, args
}

func usage(w io.Writer) {
	fmt.Fprint(w, "spoolcast — a notification pipeline: a durable relay beside each producer, Postgres as the source of truth.\n\n")
	fmt.Fprint(w, "Usage: spoolcast <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\n`spoolcast <command> --help` lists a command's flags, each with its default and\n"+
		"environment variable (a flag on the command line wins); docs/configuration.md lists them all.\n"+
		"`spoolcast --version` prints the version and commit.\n")
}

// Set at build time (`make build` does, from git): -ldflags "-X main.buildVersion=v1.2.3 -X main.buildCommit=abc123".
var buildVersion, buildCommit string

// version is the release and the commit the binary was built from: from the
// linker flags, or else from the build information Go records.
func version() string {
	ver, commit, goVersion := buildVersion, buildCommit, "go"
	if info, ok := debug.ReadBuildInfo(); ok {
		goVersion = info.GoVersion
		ver = cmp.Or(ver, info.Main.Version)
		vcs := map[string]string{}
		for _, s := range info.Settings {
			vcs[s.Key] = s.Value
		}
		if commit == "" && vcs["vcs.revision"] != "" {
			commit = vcs["vcs.revision"]
			if vcs["vcs.modified"] == "true" {
				commit += "-dirty"
			}
		}
	}
	out := "spoolcast " + cmp.Or(ver, "(devel)")
	if commit != "" {
		out += " commit " + commit
	}
	return out + " " + goVersion
}

// signalContext is cancelled by the first SIGINT, SIGTERM or SIGHUP (the
// terminal closed), which starts a graceful shutdown; a second signal exits at once.
func signalContext(stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "spoolcast: shutting down; send the signal again to exit at once")
			cancel()
		case <-done:
			return
		}
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "spoolcast: second signal, exiting now")
			os.Exit(130)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}
