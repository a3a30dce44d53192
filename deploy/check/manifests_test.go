package check

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestManifests renders every kustomization under deploy/kubernetes and
// checks it. The flags come from the spoolcast binary's own help: set
// SPOOLCAST_BIN to use a built one, else the test builds ./cmd/spoolcast.
func TestManifests(t *testing.T) {
	root := repoRoot(t)
	cli := spoolcastCLI(t)
	kdir := filepath.Join(root, "deploy", "kubernetes")
	roots, err := Roots(kdir)
	if err != nil {
		t.Fatal(err)
	}
	overlays, relays := 0, 0
	for _, r := range roots {
		if path.Dir(r) == "overlays" {
			overlays++
		}
		// Rendered one after the other: kustomize's schema cache is shared.
		t.Run(r, func(t *testing.T) {
			c := check(tReporter{t}, filepath.Join(kdir, r), r, cli)
			relays += len(c.relays)
		})
	}
	if overlays < 2 {
		t.Errorf("%d overlays under deploy/kubernetes/overlays: want at least staging and production", overlays)
	}
	if relays == 0 {
		t.Error("no kustomization runs the relay: the producer example is missing")
	}
}

// reporter is what the checks report to: a *testing.T in TestManifests, a
// recorder in TestChecksCatch.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Run(name string, f func(reporter))
}

type tReporter struct{ *testing.T }

func (t tReporter) Run(name string, f func(reporter)) {
	t.T.Run(name, func(t *testing.T) { f(tReporter{t}) })
}

// check renders the kustomization in path (named dir: "overlays/staging")
// and runs every check on it.
func check(t reporter, path, dir string, cli *CLI) *checker {
	m, errs := Load(path)
	t.Run("every object decodes strictly into its type", func(t reporter) {
		for _, err := range errs {
			t.Errorf("%v", err)
		}
	})
	c := &checker{dir: dir, m: m, cli: cli}
	if m == nil {
		return c
	}
	c.collect(t)
	c.run(t)
	return c
}

// checker holds one rendered kustomization and what runs spoolcast in it.
type checker struct {
	dir     string
	m       *Manifests
	cli     *CLI
	all     []spoolcastRun
	central []spoolcastRun
	relays  []spoolcastRun
	migrate []spoolcastRun
}

// spoolcastRun is one container running spoolcast in a workload.
type spoolcastRun struct {
	w    Workload
	init bool // an init container
	in   Invocation
	args []string // the container's args, command first
}

func (r spoolcastRun) String() string { return r.w.String() + " container " + r.in.Container.Name }

// collect finds the containers that run spoolcast; how each is invoked is
// checked here, against the binary's help.
func (c *checker) collect(t reporter) {
	t.Run("every spoolcast container runs a command and flags that exist", func(t reporter) {
		for _, w := range c.m.Workloads {
			spec := w.Template.Spec
			for i, ct := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				if !IsSpoolcastImage(ct.Image) {
					continue
				}
				in, errs := c.cli.Invoke(ct)
				for _, err := range errs {
					t.Errorf("%s: %v", w, err)
				}
				if in.Command.Name == "" {
					continue
				}
				r := spoolcastRun{w: w, init: i < len(spec.InitContainers), in: in, args: ct.Args}
				c.all = append(c.all, r)
				switch in.Command.Name {
				case "central":
					c.central = append(c.central, r)
				case "relay":
					c.relays = append(c.relays, r)
				case "migrate":
					c.migrate = append(c.migrate, r)
				}
			}
		}
	})
}

func (c *checker) run(t reporter) {
	deploysCentral := c.dir == "base" || path.Dir(c.dir) == "overlays"
	if deploysCentral {
		if len(c.central) != 1 {
			t.Errorf("%d containers run spoolcast central: want one Deployment of it", len(c.central))
		}
		if len(c.migrate) != 1 {
			t.Errorf("%d containers run spoolcast migrate: want one Job", len(c.migrate))
		}
	}
	if c.dir != "base" {
		t.Run("every object has a namespace", c.namespaced)
		t.Run("every image is pinned to a release", c.pinned)
	}
	t.Run("every spoolcast container has a memory limit above its GOMEMLIMIT", c.memory)
	for _, r := range c.central {
		t.Run("central is ready on /readyz and live on /healthz, on its ops (else listen) port", func(t reporter) { c.centralProbes(t, r) })
		t.Run("central queries through the pooled URL and listens on the direct one", func(t reporter) { c.centralDatabase(t, r) })
		t.Run("central reads its service secret from a mounted Secret and its origins are set", func(t reporter) { c.centralSecrets(t, r) })
		t.Run("central's grace period covers its preStop pause and shutdown timeout", func(t reporter) { c.centralGrace(t, r) })
		t.Run("central's replicas, autoscaler and disruption budget agree", func(t reporter) { c.centralScaling(t, r) })
		t.Run("central's Service and ServiceMonitor reach its pods' /metrics", func(t reporter) { c.centralService(t, r) })
	}
	for _, r := range c.migrate {
		t.Run("the migration Job runs migrate up against the direct URL", func(t reporter) { c.migration(t, r) })
	}
	for _, r := range c.relays {
		t.Run("the relay is a native sidecar with time to drain", func(t reporter) { c.relaySidecar(t, r) })
		t.Run("the relay is probed on its ops listener", func(t reporter) { c.relayProbes(t, r) })
		t.Run("the relay's spool is on a volume that outlives its container", func(t reporter) { c.relaySpool(t, r) })
	}
	if len(c.m.PodMonitors) > 0 {
		t.Run("every PodMonitor selects pods that have its ports", c.podMonitors)
	}
}

func (c *checker) namespaced(t reporter) {
	for _, o := range c.m.Objects {
		if o.Namespace == "" {
			t.Errorf("%s has no namespace: set one in the kustomization", o)
		}
	}
}

func (c *checker) pinned(t reporter) {
	for _, w := range c.m.Workloads {
		for _, ct := range append(append([]corev1.Container{}, w.Template.Spec.InitContainers...), w.Template.Spec.Containers...) {
			if tag := imageTag(ct.Image); tag == "" || tag == "latest" {
				t.Errorf("%s container %s runs %q: pin a release (images: newTag in the kustomization)", w, ct.Name, ct.Image)
			}
		}
	}
}

// imageTag is an image's tag, or its digest.
func imageTag(image string) string {
	if _, digest, ok := strings.Cut(image, "@"); ok {
		return digest
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return ""
}

func (c *checker) memory(t reporter) {
	for _, r := range c.all {
		limit, ok := r.in.Container.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			t.Errorf("%s has no memory limit", r)
			continue
		}
		v, ok := r.in.Env("GOMEMLIMIT")
		if !ok {
			continue
		}
		n, err := parseGoMemLimit(v)
		if err != nil {
			t.Errorf("%s: GOMEMLIMIT: %v", r, err)
		} else if n >= limit.Value() {
			t.Errorf("%s: GOMEMLIMIT %s is not below the memory limit %s: the kernel would kill before Go collects", r, v, limit.String())
		}
	}
}

// parseGoMemLimit reads GOMEMLIMIT as Go's runtime does: bytes, or a whole
// number of B, KiB, MiB, GiB or TiB.
func parseGoMemLimit(v string) (int64, error) {
	for _, bad := range []string{"KB", "MB", "GB", "TB"} {
		if strings.HasSuffix(v, bad) {
			return 0, fmt.Errorf("%q: Go's runtime takes B, KiB, MiB, GiB or TiB, not %s", v, bad)
		}
	}
	return ParseSize(v)
}

func duration(t reporter, r spoolcastRun, flag string) (time.Duration, bool) {
	t.Helper()
	s := r.in.Get(flag)
	d, err := time.ParseDuration(s.Value)
	if err != nil {
		t.Errorf("%s: --%s %q (%s): %v", r, flag, s.Value, s.Source, err)
	}
	return d, err == nil
}

// probeOn checks that probe is an HTTP GET of one of paths on port.
func probeOn(t reporter, r spoolcastRun, name string, probe *corev1.Probe, port int32, paths ...string) {
	t.Helper()
	if probe == nil || probe.HTTPGet == nil {
		t.Errorf("%s: no %s with httpGet", r, name)
		return
	}
	if !strings.Contains(" "+strings.Join(paths, " ")+" ", " "+probe.HTTPGet.Path+" ") {
		t.Errorf("%s: %s gets %q, want %s", r, name, probe.HTTPGet.Path, strings.Join(paths, " or "))
	}
	got, err := ContainerPort(r.in.Container, probe.HTTPGet.Port)
	if err != nil {
		t.Errorf("%s: %s: %v", r, name, err)
	} else if got != port {
		t.Errorf("%s: %s probes port %d, but spoolcast listens on %d", r, name, got, port)
	}
}

// secretKey is where a setting comes from when it comes from a Secret.
func secretKey(s Setting) (name, key string, ok bool) {
	if s.From == nil || s.From.SecretKeyRef == nil {
		return "", "", false
	}
	return s.From.SecretKeyRef.Name, s.From.SecretKeyRef.Key, true
}

// grace is a pod's terminationGracePeriodSeconds, 30 when unset.
func grace(spec corev1.PodSpec) time.Duration {
	if spec.TerminationGracePeriodSeconds == nil {
		return 30 * time.Second
	}
	return time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
}

func (c *checker) migration(t reporter, r spoolcastRun) {
	if r.w.Kind != "Job" {
		t.Errorf("%s: migrations run as a Job", r)
	}
	if len(r.args) < 2 || r.args[1] != "up" {
		t.Errorf("%s runs spoolcast %s: want migrate up", r, strings.Join(r.args, " "))
	}
	if _, key, ok := secretKey(r.in.Get("database-url")); !ok || key != "direct-url" {
		t.Errorf("%s: the migration's SPOOLCAST_DATABASE_URL must come from the Secret's direct-url: its advisory lock needs a session, not PgBouncer's transaction mode (got key %q)", r, key)
	}
}

func (c *checker) relaySidecar(t reporter, r spoolcastRun) {
	ct := r.in.Container
	if !r.init || ct.RestartPolicy == nil || *ct.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: the relay must be a native sidecar: an initContainers entry with restartPolicy: Always", r)
	}
	producers := 0
	for _, p := range r.w.Template.Spec.Containers {
		if !IsSpoolcastImage(p.Image) {
			producers++
		}
	}
	if producers == 0 {
		t.Errorf("%s: no producer container beside the relay", r)
	}
	shutdown, ok := duration(t, r, "shutdown-timeout")
	if ok {
		if g := grace(r.w.Template.Spec); g <= shutdown {
			t.Errorf("%s: terminationGracePeriodSeconds %s does not exceed the relay's --shutdown-timeout %s (%s): its drain would be killed", r, g, shutdown, r.in.Get("shutdown-timeout").Source)
		}
	}
	listen := r.in.Get("listen")
	if !IsLoopback(listen.Value) && !r.in.Get("service-jwt-secret-file").Set {
		t.Errorf("%s: --listen %s is not loopback and no --service-jwt-secret-file is set: the relay refuses to start", r, listen.Value)
	}
}

func (c *checker) relayProbes(t reporter, r spoolcastRun) {
	ops := r.in.Get("ops-listen")
	if !ops.Set || ops.Value == "" {
		t.Errorf("%s: no SPOOLCAST_OPS_LISTEN: the kubelet cannot probe a relay on loopback", r)
		return
	}
	if IsLoopback(ops.Value) {
		t.Errorf("%s: --ops-listen %s is loopback: the kubelet and Prometheus reach the pod's address", r, ops.Value)
		return
	}
	port, err := ListenPort(ops.Value)
	if err != nil {
		t.Errorf("%s: --ops-listen %q: %v", r, ops.Value, err)
		return
	}
	ct := r.in.Container
	probeOn(t, r, "startupProbe", ct.StartupProbe, port, "/healthz", "/readyz")
	probeOn(t, r, "readinessProbe", ct.ReadinessProbe, port, "/healthz", "/readyz")
	if ct.LivenessProbe != nil {
		// /readyz is 503 while the spool is full: a liveness probe on it
		// would restart a relay that is waiting for Postgres.
		probeOn(t, r, "livenessProbe", ct.LivenessProbe, port, "/healthz")
	}
}

// walReserve is the room the spool's WAL takes beyond its events, and
// keptKeyBytes what each forwarded key kept for --key-ttl takes
// (docs/operations.md, sizing the spool).
const (
	walReserve   = 64 << 20
	keptKeyBytes = 194
)

// peakRateAnnotation, on a relay's pod template, states the producer's peak
// events per second: the kept keys, and so the spool's volume, follow from it.
const peakRateAnnotation = "spoolcast.io/peak-events-per-second"

func (c *checker) relaySpool(t reporter, r spoolcastRun) {
	spool := r.in.Get("spool").Value
	if !strings.HasPrefix(spool, "/") {
		t.Errorf("%s: --spool %q is relative to the container's working directory, on its own filesystem: put it on a volume", r, spool)
		return
	}
	var mount *corev1.VolumeMount
	for i, vm := range r.in.Container.VolumeMounts {
		if strings.HasPrefix(spool, strings.TrimSuffix(vm.MountPath, "/")+"/") && (mount == nil || len(vm.MountPath) > len(mount.MountPath)) {
			mount = &r.in.Container.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Errorf("%s: --spool %s is on the container's own filesystem, lost when it restarts: mount a volume there", r, spool)
		return
	}
	if strings.Contains(" "+strings.Join(r.w.Claims, " ")+" ", " "+mount.Name+" ") {
		return // a StatefulSet's claim per replica
	}
	for _, v := range r.w.Template.Spec.Volumes {
		if v.Name != mount.Name {
			continue
		}
		switch {
		case v.PersistentVolumeClaim != nil, v.Ephemeral != nil:
		case v.EmptyDir != nil:
			if v.EmptyDir.Medium == corev1.StorageMediumMemory {
				t.Errorf("%s: the spool's emptyDir is in memory: a 202 would not be on disk, and the spool would count against the pod's memory", r)
			}
			if lim := v.EmptyDir.SizeLimit; lim != nil {
				maxBytes, err := ParseSize(r.in.Get("spool-max-bytes").Value)
				if err != nil {
					t.Errorf("%s: --spool-max-bytes: %v", r, err)
					return
				}
				keyTTL, ok := duration(t, r, "key-ttl")
				if !ok {
					return
				}
				rate, err := strconv.ParseFloat(r.w.Template.Annotations[peakRateAnnotation], 64)
				if err != nil || rate <= 0 {
					t.Errorf("%s: the pod template has no %s annotation: state the producer's peak rate, which sizes the kept keys and so the spool's volume", r, peakRateAnnotation)
					return
				}
				keys := int64(rate * keyTTL.Seconds() * keptKeyBytes)
				var refeed int64
				if window, ok := duration(t, r, "refeed-window"); !ok {
					return
				} else if window > 0 {
					if refeed, err = ParseSize(r.in.Get("refeed-max-bytes").Value); err != nil {
						t.Errorf("%s: --refeed-max-bytes: %v", r, err)
						return
					}
				}
				if need := resource.NewQuantity(maxBytes+keys+refeed+walReserve, resource.BinarySI); lim.Cmp(*need) <= 0 {
					t.Errorf("%s: the spool's emptyDir sizeLimit %s does not exceed --spool-max-bytes + kept keys (%g events/s for --key-ttl %s) + --refeed-max-bytes + WAL = %s: past it the kubelet evicts the pod at once, spool and all, and the relay never says 503", r, lim.String(), rate, keyTTL, need.String())
				}
			}
		default:
			t.Errorf("%s: the spool's volume %s is neither an emptyDir nor a PersistentVolumeClaim", r, v.Name)
		}
		return
	}
	t.Errorf("%s: no volume %s", r, mount.Name)
}

func (c *checker) podMonitors(t reporter) {
	for _, pm := range c.m.PodMonitors {
		var selected int
		for _, w := range c.m.Workloads {
			if !Selects(&pm.Spec.Selector, w.Template.Labels) {
				continue
			}
			selected++
			ports := map[string]bool{}
			for _, ct := range append(append([]corev1.Container{}, w.Template.Spec.InitContainers...), w.Template.Spec.Containers...) {
				for _, p := range ct.Ports {
					ports[p.Name] = true
				}
			}
			for _, e := range pm.Spec.PodMetricsEndpoints {
				if err := e.Validate(); err != nil {
					t.Errorf("PodMonitor/%s: %v", pm.Name, err)
				}
				if !ports[e.Port] {
					t.Errorf("PodMonitor/%s scrapes port %q, which no container of %s names", pm.Name, e.Port, w)
				}
			}
		}
		if selected == 0 {
			t.Errorf("PodMonitor/%s selects no pods here", pm.Name)
		}
		if len(pm.Spec.PodMetricsEndpoints) == 0 {
			t.Errorf("PodMonitor/%s has no podMetricsEndpoints", pm.Name)
		}
	}
}

// repoRoot is the main module's directory, two levels up.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(mod, []byte("module github.com/spoolcast/spoolcast\n")) {
		t.Fatalf("%s is not spoolcast's repository root (go.mod: %v)", root, err)
	}
	return root
}

var cli struct {
	once sync.Once
	dir  string
	cli  *CLI
	err  error
}

// spoolcastCLI is what the spoolcast binary says of its commands and flags,
// read once: from $SPOOLCAST_BIN, or from ./cmd/spoolcast built for the tests.
func spoolcastCLI(t *testing.T) *CLI {
	t.Helper()
	root := repoRoot(t)
	cli.once.Do(func() {
		bin := os.Getenv("SPOOLCAST_BIN")
		if bin == "" {
			if cli.dir, cli.err = os.MkdirTemp("", "spoolcast-check-"); cli.err != nil {
				return
			}
			bin = filepath.Join(cli.dir, "spoolcast")
			build := exec.Command("go", "build", "-o", bin, "./cmd/spoolcast")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				cli.err = fmt.Errorf("go build ./cmd/spoolcast: %v\n%s", err, out)
				return
			}
		}
		cli.cli, cli.err = ReadCLI(bin)
	})
	if cli.err != nil {
		t.Fatal(cli.err)
	}
	return cli.cli
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cli.dir != "" {
		os.RemoveAll(cli.dir)
	}
	os.Exit(code)
}
