package check

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func (c *checker) centralProbes(t reporter, r spoolcastRun) {
	if r.w.Kind != "Deployment" {
		t.Errorf("%s: central runs as a Deployment", r)
	}
	listen := r.in.Get("listen")
	if IsLoopback(listen.Value) {
		t.Errorf("%s: --listen %s (%s) takes no connections from outside the pod: set SPOOLCAST_LISTEN=0.0.0.0:8080", r, listen.Value, listen.Source)
		return
	}
	port, err := ListenPort(listen.Value)
	if err != nil {
		t.Errorf("%s: --listen %q: %v", r, listen.Value, err)
		return
	}
	// With --ops-listen the probes are served there, and only there.
	if ops := r.in.Get("ops-listen"); ops.Value != "" {
		if IsLoopback(ops.Value) {
			t.Errorf("%s: --ops-listen %s (%s) takes no connections from outside the pod: the kubelet's probes and Prometheus could not reach it", r, ops.Value, ops.Source)
			return
		}
		if port, err = ListenPort(ops.Value); err != nil {
			t.Errorf("%s: --ops-listen %q: %v", r, ops.Value, err)
			return
		}
	}
	ct := r.in.Container
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", ct.ReadinessProbe, "/readyz"}, {"livenessProbe", ct.LivenessProbe, "/healthz"}} {
		probeOn(t, r, p.name, p.probe, port, p.path)
	}
}

func (c *checker) centralDatabase(t reporter, r spoolcastRun) {
	pooledSecret, pooledKey, ok := secretKey(r.in.Get("database-url"))
	if !ok || pooledKey != "pooled-url" {
		t.Errorf("%s: SPOOLCAST_DATABASE_URL must come from the Secret's pooled-url (got key %q)", r, pooledKey)
	}
	directSecret, directKey, ok := secretKey(r.in.Get("direct-database-url"))
	if !ok || directKey != "direct-url" {
		t.Errorf("%s: SPOOLCAST_DIRECT_DATABASE_URL must come from the Secret's direct-url: LISTEN needs Postgres itself (got key %q)", r, directKey)
	}
	if pooledSecret != directSecret {
		t.Errorf("%s: the pooled URL comes from Secret %q, the direct one from %q: want one Secret", r, pooledSecret, directSecret)
	}
}

func (c *checker) centralSecrets(t reporter, r spoolcastRun) {
	if s := r.in.Get("service-jwt-secret-file"); !s.Set || s.Value == "" {
		t.Errorf("%s: no SPOOLCAST_SERVICE_JWT_SECRET_FILE: /internal would answer 401 to every service", r)
	} else if err := fileFromSecret(r.w.Template.Spec, r.in.Container, s.Value); err != nil {
		t.Errorf("%s: SPOOLCAST_SERVICE_JWT_SECRET_FILE %s: %v", r, s.Value, err)
	}
	if s := r.in.Get("allowed-origins"); !s.Set || s.Value == "" {
		t.Errorf("%s: SPOOLCAST_ALLOWED_ORIGINS is not set: browsers could not open /v1/stream", r)
	}
}

// fileFromSecret checks that file is a key of a Secret mounted in c.
func fileFromSecret(spec corev1.PodSpec, c corev1.Container, file string) error {
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			if v.Secret == nil {
				return fmt.Errorf("volume %s is not a Secret", v.Name)
			}
			if len(v.Secret.Items) == 0 {
				return nil // every key is a file
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return nil
				}
			}
			return fmt.Errorf("Secret volume %s has no item at path %s", v.Name, rel)
		}
		return fmt.Errorf("no volume %s", vm.Name)
	}
	return fmt.Errorf("no volume is mounted there")
}

func (c *checker) centralGrace(t reporter, r spoolcastRun) {
	shutdown, ok := duration(t, r, "shutdown-timeout")
	if !ok {
		return
	}
	var pause time.Duration
	if l := r.in.Container.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
		pause = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
	}
	if g := grace(r.w.Template.Spec); g <= pause+shutdown {
		t.Errorf("%s: terminationGracePeriodSeconds %s does not exceed the preStop pause %s + --shutdown-timeout %s: sockets would be killed, not closed with 1001", r, g, pause, shutdown)
	}
}

func (c *checker) centralScaling(t reporter, r spoolcastRun) {
	// The replicas to reason about: the autoscaler's least, or the
	// Deployment's own count when nothing scales it.
	replicas := *r.w.Replicas
	production := strings.HasPrefix(path.Base(c.dir), "production")
	var hpaFound bool
	for _, h := range c.m.HPAs {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != r.w.Kind || ref.Name != r.w.Name {
			continue
		}
		hpaFound = true
		if ref.APIVersion != "apps/v1" {
			t.Errorf("HorizontalPodAutoscaler/%s targets apiVersion %q: want apps/v1", h.Name, ref.APIVersion)
		}
		if r.w.ReplicasSet {
			t.Errorf("%s sets replicas while HorizontalPodAutoscaler/%s manages them: every server-side or GitOps apply would reset the autoscaler's count; leave replicas unset", r, h.Name)
		}
		replicas = 1
		if h.Spec.MinReplicas != nil {
			replicas = *h.Spec.MinReplicas
		}
		if production && replicas < 2 {
			t.Errorf("HorizontalPodAutoscaler/%s may scale production down to %d: want at least 2", h.Name, replicas)
		}
		if len(h.Spec.Metrics) == 0 {
			t.Errorf("HorizontalPodAutoscaler/%s has no metrics", h.Name)
		}
		// Expo takes 600 messages a second per project, from all replicas.
		if push := r.in.Get("push"); push.Value != "false" {
			rate := r.in.Get("expo-rate")
			if n, err := strconv.Atoi(rate.Value); err != nil || n == 0 || n*int(h.Spec.MaxReplicas) > 600 {
				t.Errorf("%s: --expo-rate %s (%s) × up to %d replicas may pass Expo's 600 messages a second: set it to 600 / maxReplicas", r, rate.Value, rate.Source, h.Spec.MaxReplicas)
			}
		}
		for _, mt := range h.Spec.Metrics {
			if mt.Resource == nil || mt.Resource.Target.Type != "Utilization" {
				continue
			}
			for _, ct := range r.w.Template.Spec.Containers {
				if _, ok := ct.Resources.Requests[mt.Resource.Name]; !ok {
					t.Errorf("HorizontalPodAutoscaler/%s scales on %s utilization, but container %s requests no %s", h.Name, mt.Resource.Name, ct.Name, mt.Resource.Name)
				}
			}
		}
	}
	if !hpaFound {
		t.Errorf("%s: no HorizontalPodAutoscaler targets it", r)
		if production && replicas < 2 {
			t.Errorf("%s: %d replicas in production: want at least 2", r, replicas)
		}
	}

	var pdbFound bool
	for _, p := range c.m.PDBs {
		if !Selects(p.Spec.Selector, r.w.Template.Labels) {
			continue
		}
		pdbFound = true
		// It must let a drain evict one replica at the fewest replicas.
		switch {
		case p.Spec.MaxUnavailable != nil:
			if n, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MaxUnavailable, int(replicas), true); err != nil || n < 1 {
				t.Errorf("PodDisruptionBudget/%s: maxUnavailable %s lets no replica go: node drains would hang", p.Name, p.Spec.MaxUnavailable.String())
			}
		case p.Spec.MinAvailable != nil:
			if n, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, int(replicas), true); err != nil || int32(n) >= replicas {
				t.Errorf("PodDisruptionBudget/%s: minAvailable %s of %d replicas lets none go: node drains would hang", p.Name, p.Spec.MinAvailable.String(), replicas)
			}
		default:
			t.Errorf("PodDisruptionBudget/%s sets neither maxUnavailable nor minAvailable", p.Name)
		}
	}
	if !pdbFound {
		t.Errorf("%s: no PodDisruptionBudget selects its pods (labels %v)", r, r.w.Template.Labels)
	}
}

func (c *checker) centralService(t reporter, r spoolcastRun) {
	listen, err := ListenPort(r.in.Get("listen").Value)
	if err != nil {
		t.Errorf("%s: --listen: %v", r, err)
		return
	}
	metricsPort := listen // where /metrics is served
	if ops := r.in.Get("ops-listen").Value; ops != "" {
		if metricsPort, err = ListenPort(ops); err != nil {
			t.Errorf("%s: --ops-listen: %v", r, err)
			return
		}
	}
	var svcs []*corev1.Service
	for _, s := range c.m.Services {
		if len(s.Spec.Selector) > 0 && Selects(selectorOf(s.Spec.Selector), r.w.Template.Labels) {
			svcs = append(svcs, s)
		}
	}
	if len(svcs) == 0 {
		t.Errorf("%s: no Service selects its pods (labels %v)", r, r.w.Template.Labels)
		return
	}
	var monitored bool
	for _, s := range svcs {
		ports := map[string]int32{}
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			n, err := ContainerPort(r.in.Container, target)
			if err != nil {
				t.Errorf("Service/%s port %s: %v", s.Name, p.Name, err)
			} else if n != listen && n != metricsPort {
				t.Errorf("Service/%s port %s reaches container port %d, but central listens on %d (and %d)", s.Name, p.Name, n, listen, metricsPort)
			}
			ports[p.Name] = n
		}
		for _, sm := range c.m.ServiceMonitors {
			if !Selects(&sm.Spec.Selector, s.Labels) {
				continue
			}
			monitored = true
			if len(sm.Spec.Endpoints) == 0 {
				t.Errorf("ServiceMonitor/%s has no endpoints", sm.Name)
			}
			for _, e := range sm.Spec.Endpoints {
				if err := e.Validate(); err != nil {
					t.Errorf("ServiceMonitor/%s: %v", sm.Name, err)
				}
				if n, ok := ports[e.Port]; !ok {
					t.Errorf("ServiceMonitor/%s scrapes port %q, which Service/%s does not name", sm.Name, e.Port, s.Name)
				} else if n != metricsPort {
					t.Errorf("ServiceMonitor/%s scrapes container port %d, but central serves /metrics on %d", sm.Name, n, metricsPort)
				}
				if e.Path != "/metrics" && e.Path != "" {
					t.Errorf("ServiceMonitor/%s scrapes %s: central serves /metrics", sm.Name, e.Path)
				}
			}
		}
	}
	if !monitored {
		t.Errorf("%s: no ServiceMonitor selects a Service of it", r)
	}
}
