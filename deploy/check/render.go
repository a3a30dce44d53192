package check

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Object is one rendered object: its identity and its JSON.
type Object struct {
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	JSON       []byte
}

// String names the object as kubectl does.
func (o Object) String() string { return o.Kind + "/" + o.Name }

// Roots lists every directory under dir holding a kustomization, relative
// to dir and sorted: the base, each overlay, each example.
func Roots(dir string) ([]string, error) {
	var roots []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch d.Name() {
		case "kustomization.yaml", "kustomization.yml", "Kustomization":
			rel, err := filepath.Rel(dir, filepath.Dir(path))
			if err != nil {
				return err
			}
			roots = append(roots, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(roots)
	return roots, err
}

// Render builds the kustomization in dir from the files on disk, as
// `kustomize build dir` (and `kubectl apply -k dir`) would.
func Render(dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []Object
	for _, r := range m.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s/%s as JSON: %w", dir, r.GetKind(), r.GetName(), err)
		}
		objs = append(objs, Object{
			APIVersion: r.GetApiVersion(),
			Kind:       r.GetKind(),
			Name:       r.GetName(),
			Namespace:  r.GetNamespace(),
			JSON:       data,
		})
	}
	return objs, nil
}
