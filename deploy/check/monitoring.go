package check

import (
	"fmt"
	"regexp"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceMonitor is the Prometheus Operator's monitoring.coreos.com/v1
// ServiceMonitor, reduced to the fields spoolcast's manifests use (named as
// in the CRD). Add a field here, spelled as the CRD spells it, before using
// it in a manifest: strict decoding refuses any other.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ServiceMonitorSpec `json:"spec"`
}

// ServiceMonitorSpec selects Services and says how to scrape their endpoints.
type ServiceMonitorSpec struct {
	JobLabel          string               `json:"jobLabel,omitempty"`
	Selector          metav1.LabelSelector `json:"selector"`
	NamespaceSelector *NamespaceSelector   `json:"namespaceSelector,omitempty"`
	Endpoints         []ScrapeEndpoint     `json:"endpoints"`
}

// PodMonitor is the Prometheus Operator's monitoring.coreos.com/v1
// PodMonitor, reduced as ServiceMonitor is.
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodMonitorSpec `json:"spec"`
}

// PodMonitorSpec selects pods and says how to scrape them.
type PodMonitorSpec struct {
	JobLabel            string               `json:"jobLabel,omitempty"`
	Selector            metav1.LabelSelector `json:"selector"`
	NamespaceSelector   *NamespaceSelector   `json:"namespaceSelector,omitempty"`
	PodMetricsEndpoints []ScrapeEndpoint     `json:"podMetricsEndpoints"`
}

// NamespaceSelector picks the namespaces a monitor looks in (its own by default).
type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

// ScrapeEndpoint is the part of an Endpoint (ServiceMonitor) or a
// PodMetricsEndpoint (PodMonitor) that the manifests use; the two spell
// these fields alike.
type ScrapeEndpoint struct {
	Port          string `json:"port,omitempty"`
	Path          string `json:"path,omitempty"`
	Scheme        string `json:"scheme,omitempty"`
	Interval      string `json:"interval,omitempty"`
	ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
}

// promDuration is the CRD's pattern for a Prometheus duration ("30s", "1m30s").
var promDuration = regexp.MustCompile(`^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$`)

// Validate checks what the CRD's schema would, for the fields used: a named
// port, an absolute path, Prometheus durations, a timeout within the interval.
func (e ScrapeEndpoint) Validate() error {
	if e.Port == "" {
		return fmt.Errorf("no port name")
	}
	if e.Path != "" && e.Path[0] != '/' {
		return fmt.Errorf("path %q is not absolute", e.Path)
	}
	if e.Scheme != "" && e.Scheme != "http" && e.Scheme != "https" {
		return fmt.Errorf("scheme %q is neither http nor https", e.Scheme)
	}
	var interval, timeout time.Duration
	for _, d := range []struct {
		name, value string
		into        *time.Duration
	}{{"interval", e.Interval, &interval}, {"scrapeTimeout", e.ScrapeTimeout, &timeout}} {
		if d.value == "" {
			continue
		}
		if !promDuration.MatchString(d.value) {
			return fmt.Errorf("%s %q is not a Prometheus duration", d.name, d.value)
		}
		// The durations used here (s, m, h) are also Go's.
		if v, err := time.ParseDuration(d.value); err == nil {
			*d.into = v
		}
	}
	if interval > 0 && timeout > interval {
		return fmt.Errorf("scrapeTimeout %s exceeds interval %s", e.ScrapeTimeout, e.Interval)
	}
	return nil
}
