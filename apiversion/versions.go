package apiversion

// The API's versions. Add a new version at the end when a change would break
// existing clients, with the Change layers that translate to and from the
// version before it; mark old versions Deprecated with a Sunset and a
// MigrationURL before removing them.
var versions = []Version{
	{
		// The first public version: the feed, read state, unread count and
		// internal ingress as documented in docs/openapi.yaml.
		Date: "2026-11-30",
	},
}

// Default returns the registry of the API's versions.
func Default() *Registry {
	r, err := NewRegistry(versions...)
	if err != nil {
		panic(err) // the list above is fixed at build time; the tests prove it valid
	}
	return r
}
