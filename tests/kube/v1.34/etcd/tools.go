//go:build tools

// etcd's server command (the module's root package is its main).
package tools

import _ "go.etcd.io/etcd/server/v3"
