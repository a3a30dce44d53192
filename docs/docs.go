// Package docs embeds the API description that central serves at /openapi.yaml.
package docs

import _ "embed"

// OpenAPI is docs/openapi.yaml, the OpenAPI 3.1 description of central's API.
//
//go:embed openapi.yaml
var OpenAPI []byte
