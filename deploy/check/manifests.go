package check

import (
	"fmt"
	"net"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Manifests is one kustomization, rendered and decoded.
type Manifests struct {
	Dir             string
	Objects         []Object
	Workloads       []Workload
	Services        []*corev1.Service
	PDBs            []*policyv1.PodDisruptionBudget
	HPAs            []*autoscalingv2.HorizontalPodAutoscaler
	ServiceMonitors []*ServiceMonitor
	PodMonitors     []*PodMonitor
}

// Workload is anything that runs pods from a template.
type Workload struct {
	Kind, Name string
	Replicas   *int32 // nil for Jobs and CronJobs; 1 when the manifest leaves it unset
	// ReplicasSet: the manifest sets replicas (an autoscaler's count is
	// then reset by every server-side or GitOps apply).
	ReplicasSet bool
	Template    corev1.PodTemplateSpec
	Claims      []string // a StatefulSet's volumeClaimTemplates
}

func (w Workload) String() string { return w.Kind + "/" + w.Name }

// Load renders the kustomization in dir and decodes every object strictly.
// It returns every decoding error, not only the first.
func Load(dir string) (*Manifests, []error) {
	objs, err := Render(dir)
	if err != nil {
		return nil, []error{err}
	}
	m := &Manifests{Dir: dir, Objects: objs}
	var errs []error
	for _, o := range objs {
		v, err := Decode(o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch v := v.(type) {
		case *appsv1.Deployment:
			m.Workloads = append(m.Workloads, Workload{Kind: o.Kind, Name: v.Name, Replicas: orOne(v.Spec.Replicas), ReplicasSet: v.Spec.Replicas != nil, Template: v.Spec.Template})
		case *appsv1.StatefulSet:
			w := Workload{Kind: o.Kind, Name: v.Name, Replicas: orOne(v.Spec.Replicas), ReplicasSet: v.Spec.Replicas != nil, Template: v.Spec.Template}
			for _, c := range v.Spec.VolumeClaimTemplates {
				w.Claims = append(w.Claims, c.Name)
			}
			m.Workloads = append(m.Workloads, w)
		case *batchv1.Job:
			m.Workloads = append(m.Workloads, Workload{Kind: o.Kind, Name: v.Name, Template: v.Spec.Template})
		case *batchv1.CronJob:
			m.Workloads = append(m.Workloads, Workload{Kind: o.Kind, Name: v.Name, Template: v.Spec.JobTemplate.Spec.Template})
		case *corev1.Service:
			m.Services = append(m.Services, v)
		case *policyv1.PodDisruptionBudget:
			m.PDBs = append(m.PDBs, v)
		case *autoscalingv2.HorizontalPodAutoscaler:
			m.HPAs = append(m.HPAs, v)
		case *ServiceMonitor:
			m.ServiceMonitors = append(m.ServiceMonitors, v)
		case *PodMonitor:
			m.PodMonitors = append(m.PodMonitors, v)
		}
	}
	return m, errs
}

// orOne is the API server's default of replicas.
func orOne(n *int32) *int32 {
	if n == nil {
		one := int32(1)
		return &one
	}
	return n
}

// Selects reports whether sel matches the labels; an empty or invalid
// selector matches nothing here (the API server refuses an invalid one, and
// an empty one selecting everything is never what is meant).
func Selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(set))
}

// ContainerPort resolves a probe's or a Service's port (a number or a
// container port's name) to a number in c.
func ContainerPort(c corev1.Container, p intstr.IntOrString) (int32, error) {
	if p.Type == intstr.Int {
		return p.IntVal, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, p.StrVal)
}

// ListenPort is the port of a host:port listen address.
func ListenPort(addr string) (int32, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	return int32(n), err
}

// IsLoopback reports whether a listen address takes connections from this
// pod only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// selectorOf is a Service's equality selector as a LabelSelector.
func selectorOf(m map[string]string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: m}
}
