//go:build tools

// Pins github.com/hashicorp/packer at v1.9.4 for tests/setup/build-packer (go.sum is the lock).
package tools

import _ "github.com/hashicorp/packer"
