# An autonode node AMI, for amd64 and arm64 at once: Debian 12's own AMI,
# with kubelet, containerd and the agent's package, and kubelet's version
# recorded for the agent. Both AMIs are made by packaging/bake/provision,
# the script that also makes the VM tests' image (tests/setup/build-vm-image).
#
#   cd packaging/examples/packer
#   packer init .          # the amazon plugin
#   packer build -var region=us-west-2 -var kubernetes_version=1.34.2 \
#     -var repository=https://packages.example.com/autonode/apt \
#     -var repository_key=autonode-release-key.asc .
#   packer build -only='*.arm64' ...   # one architecture
#
# The agent comes from the release's signed APT repository (packaging/sign
# lays it out; apt checks it with the release key only, signed-by). Without
# `repository`, the .deb is uploaded from `packages` instead (packaging/build
# makes them in target/packages/), as before.
#
# The Packer and plugin it needs and the region and kubernetes_version
# inputs are in shared.pkr.hcl, which the attestable template
# (attestable/) shares.
#
# Tested by `packer validate` in tests/run (Packer 1.9.4, amazon plugin
# 1.3.4); not built against AWS there. Walkthrough: ../AMI.md.

variable "agent_version" {
  type        = string
  description = "The agent's package version: packaging/build names its packages autonode-agent_<version>-1_<arch>.deb (`packaging/version --package`: 0.3.0~dev between releases)."
  default     = "0.3.0~dev"
}

variable "repository" {
  type        = string
  description = "The URL of the release's signed APT repository (the apt/ folder packaging/sign lays out, served over HTTPS); the agent is installed from it, checked with repository_key. Empty: the .deb is uploaded from `packages` instead."
  default     = ""
}

variable "repository_key" {
  type        = string
  description = "With `repository`: the release's public key file (autonode-release-key.asc), whose fingerprint you checked against the one packaging/README.md publishes. apt trusts the repository with this key and no other."
  default     = ""
}

variable "packages" {
  type        = string
  description = "Without `repository`: the directory with the agent's .deb packages; empty means this repository's target/packages/."
  default     = ""
}

variable "ami_name_prefix" {
  type    = string
  default = "autonode-node"
}

variable "source_ami_owner" {
  type        = string
  description = "Who publishes the source AMI: Debian's account, whose AMIs are named debian-12-<arch>-<date>-<build>."
  default     = "136693071363"
}

locals {
  packages  = var.packages != "" ? var.packages : "${path.root}/../../../target/packages"
  bake      = "${path.root}/../../bake"
  # One timestamp for both architectures' names.
  stamp = formatdate("YYYYMMDDhhmm", timestamp())
}

# What both architectures share; the build below sets what differs.
source "amazon-ebs" "node" {
  region       = var.region
  ssh_username = "admin"
  # The agent requires IMDSv2 at boot (EC2NodeClass: httpTokens required,
  # hop limit 1); the AMI says it supports nothing else, and the build
  # instance uses it too.
  imds_support = "v2.0"
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  ena_support = true
  tags = {
    Name               = "${var.ami_name_prefix}-${local.stamp}"
    "autonode:agent"   = var.agent_version
    "autonode:kubelet" = var.kubernetes_version
    "autonode:source"  = "{{ .SourceAMIName }}"
  }
}

build {
  source "amazon-ebs.node" {
    name          = "amd64"
    ami_name      = "${var.ami_name_prefix}-amd64-${local.stamp}"
    instance_type = "m6i.large"
    source_ami_filter {
      filters = {
        name                = "debian-12-amd64-*"
        architecture        = "x86_64"
        root-device-type    = "ebs"
        virtualization-type = "hvm"
      }
      owners      = [var.source_ami_owner]
      most_recent = true
    }
  }

  source "amazon-ebs.node" {
    name          = "arm64"
    ami_name      = "${var.ami_name_prefix}-arm64-${local.stamp}"
    instance_type = "m7g.large"
    source_ami_filter {
      filters = {
        name                = "debian-12-arm64-*"
        architecture        = "arm64"
        root-device-type    = "ebs"
        virtualization-type = "hvm"
      }
      owners      = [var.source_ami_owner]
      most_recent = true
    }
  }

  provisioner "shell" {
    inline = ["mkdir -p /tmp/autonode"]
  }

  # The release key (to install from the repository) or the package itself.
  # source.name is the architecture, as Debian and Kubernetes spell it.
  provisioner "file" {
    sources     = var.repository != "" ? [var.repository_key] : ["${local.packages}/autonode-agent_${var.agent_version}-1_${source.name}.deb"]
    destination = "/tmp/autonode/"
  }

  # The script and the kubelet unit it installs where the image has none:
  # the folder (no trailing slash) becomes /tmp/bake.
  provisioner "file" {
    source      = local.bake
    destination = "/tmp"
  }

  provisioner "shell" {
    inline = [
      "set -eu",
      "url=https://dl.k8s.io/release/v${var.kubernetes_version}/bin/linux/${source.name}/kubelet",
      "curl -fsSLo /tmp/kubelet \"$url\"",
      "echo \"$(curl -fsSL \"$url.sha256\")  /tmp/kubelet\" | sha256sum --check --strict",
      "deb=/tmp/autonode/autonode-agent_${var.agent_version}-1_${source.name}.deb",
      # From the repository: apt trusts it with the release key only, and
      # `apt-get download` refuses a package whose hash is not the one the
      # signed index names. The source stays on the AMI, signed-by that key.
      "if [ -n '${var.repository}' ]; then",
      "  key=/tmp/autonode/$(basename '${var.repository_key}')",
      "  sudo install -D -m 0644 \"$key\" /usr/share/keyrings/autonode.asc",
      "  echo 'deb [signed-by=/usr/share/keyrings/autonode.asc] ${var.repository} stable main' | sudo tee /etc/apt/sources.list.d/autonode.list >/dev/null",
      "  sudo apt-get update -o APT::Update::Error-Mode=any",
      "  (cd /tmp/autonode && apt-get download autonode-agent=${var.agent_version}-1)",
      "fi",
      "chmod 0755 /tmp/bake/provision",
      "sudo /tmp/bake/provision --kubelet /tmp/kubelet \"$deb\"",
      "rm -rf /tmp/kubelet /tmp/autonode /tmp/bake",
      # Nothing of the build instance's own boot goes into the AMI: no
      # machine-id (each instance makes its own), no apt lists.
      "sudo truncate -s 0 /etc/machine-id",
      "sudo rm -rf /var/lib/apt/lists/*",
    ]
  }
}
