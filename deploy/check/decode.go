package check

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
)

// types maps each apiVersion and kind the manifests may hold to its Go type.
// A kind missing here fails the check: add it rather than let it pass
// unchecked.
var types = map[string]func() any{
	"apps/v1 Deployment":                      func() any { return new(appsv1.Deployment) },
	"apps/v1 StatefulSet":                     func() any { return new(appsv1.StatefulSet) },
	"v1 Service":                              func() any { return new(corev1.Service) },
	"v1 ConfigMap":                            func() any { return new(corev1.ConfigMap) },
	"v1 Secret":                               func() any { return new(corev1.Secret) },
	"v1 ServiceAccount":                       func() any { return new(corev1.ServiceAccount) },
	"v1 Namespace":                            func() any { return new(corev1.Namespace) },
	"batch/v1 Job":                            func() any { return new(batchv1.Job) },
	"batch/v1 CronJob":                        func() any { return new(batchv1.CronJob) },
	"policy/v1 PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"autoscaling/v2 HorizontalPodAutoscaler":  func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"networking.k8s.io/v1 NetworkPolicy":      func() any { return new(networkingv1.NetworkPolicy) },
	"networking.k8s.io/v1 Ingress":            func() any { return new(networkingv1.Ingress) },
	"monitoring.coreos.com/v1 ServiceMonitor": func() any { return new(ServiceMonitor) },
	"monitoring.coreos.com/v1 PodMonitor":     func() any { return new(PodMonitor) },
}

// Decode decodes o into its Go type strictly, as the API server's strict
// field validation does: a field the type does not have (a typo, a field at
// the wrong level), a key given twice, or a value of the wrong type is an
// error.
func Decode(o Object) (any, error) {
	newObj, ok := types[o.APIVersion+" "+o.Kind]
	if !ok {
		return nil, fmt.Errorf("%s: no typed check for apiVersion %s kind %s (add it to deploy/check/decode.go)", o, o.APIVersion, o.Kind)
	}
	v := newObj()
	strict, err := kjson.UnmarshalStrict(o.JSON, v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %v", o, strict)
	}
	return v, nil
}
