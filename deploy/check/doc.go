// Package check renders spoolcast's Kubernetes manifests (every kustomization
// under deploy/kubernetes) with the kustomize API and checks what they say:
// each object decodes strictly into its Kubernetes type, and the properties
// spoolcast relies on hold (probes, replicas, disruption budget, the relay as
// a native sidecar with room to drain, flags that exist).
//
// It is a module of its own, so that the main module carries no Kubernetes
// dependencies and its `go test ./...` does not see it. Run it with
// `make check-deploy`, or `go test ./...` in this directory.
package check
