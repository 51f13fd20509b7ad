//go:build tools

// Pins github.com/hashicorp/packer-plugin-amazon at v1.3.4 for tests/setup/build-packer (go.sum is the lock).
package tools

import _ "github.com/hashicorp/packer-plugin-amazon"
